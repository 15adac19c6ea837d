# Header-only CLI and JSON libraries (Debian: libcli11-dev, nlohmann-json3-dev).
# Where their CMake packages are missing (the GPU machine has no package
# registry), METRALE_THIRD_PARTY_INCLUDE may point at a copy of the headers.
set(METRALE_THIRD_PARTY_INCLUDE "" CACHE PATH "Directory holding CLI/ and nlohmann/ headers when not installed")
find_package(CLI11 CONFIG QUIET)
find_package(nlohmann_json CONFIG QUIET)
add_library(metrale_third_party INTERFACE)
if(CLI11_FOUND AND nlohmann_json_FOUND)
  target_link_libraries(metrale_third_party INTERFACE CLI11::CLI11 nlohmann_json::nlohmann_json)
elseif(METRALE_THIRD_PARTY_INCLUDE)
  target_include_directories(metrale_third_party SYSTEM INTERFACE ${METRALE_THIRD_PARTY_INCLUDE})
else()
  message(FATAL_ERROR "CLI11 and nlohmann_json not found: apt-get install libcli11-dev nlohmann-json3-dev, "
                      "or set METRALE_THIRD_PARTY_INCLUDE")
endif()
