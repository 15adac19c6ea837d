// Decode tables of the CPU backend, built from metrale/codec.hpp.
#include "cpu/kv_rows.hpp"

namespace metrale::cpu::detail {

const CodecTables& CodecTables::get() {
  static const CodecTables tables = [] {
    CodecTables t{};
    for (int c = 0; c < 256; ++c) {
      t.e4m3[c] = codec::e4m3_to_float(uint8_t(c));
      t.e2m1_pair[c][0] = codec::e2m1_to_float(uint8_t(c & 15));
      t.e2m1_pair[c][1] = codec::e2m1_to_float(uint8_t(c >> 4));
    }
    return t;
  }();
  return tables;
}

}  // namespace metrale::cpu::detail
