// The page allocator (metrale/block_allocator.hpp) as _metrale.BlockAllocator:
// the one allocator of the `metrale` command's serve-sim and the Python
// package's transformers cache. Bookkeeping errors (an unknown or free page)
// raise ValueError through the module's translator; an empty pool is None
// from allocate() and writable(), for the caller to report.

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/vector.h>

#include <vector>

#include "ext_common.hpp"
#include "metrale/block_allocator.hpp"

namespace metrale_ext {

void bind_block_allocator(nb::module_& m) {
  nb::class_<BlockAllocator>(m, "BlockAllocator")
      .def(nb::init<int32_t>(), nb::arg("num_blocks"))
      .def("allocate", &BlockAllocator::allocate)
      .def("share", &BlockAllocator::share, nb::arg("block"))
      .def("free", &BlockAllocator::free, nb::arg("block"))
      .def("writable", &BlockAllocator::writable, nb::arg("block"))
      // Every page of `blocks` gets one more holder, or (free_all) drops one:
      // the bulk forms a batch remap and a crop need. Checked first, so a
      // refused call changes nothing.
      .def(
          "share_all",
          [](BlockAllocator& a, const std::vector<int32_t>& blocks) {
            for (int32_t b : blocks)
              if (!a.is_used(b)) value_error("'blocks': page ", b, " is not in use; expected pages in use to share");
            for (int32_t b : blocks) a.share(b);
          },
          nb::arg("blocks"))
      .def(
          "free_all",
          [](BlockAllocator& a, const std::vector<int32_t>& blocks) {
            std::vector<int32_t> held(size_t(a.total()), 0);
            for (int32_t b : blocks) {
              if (!a.is_used(b) || ++held[size_t(b)] > a.ref_count(b))
                value_error("'blocks': page ", b, " freed more often than it is held (", a.ref_count(b),
                            " holders); expected each page at most its reference count times");
            }
            for (int32_t b : blocks) a.free(b);
          },
          nb::arg("blocks"))
      .def("ref_count", &BlockAllocator::ref_count, nb::arg("block"))
      .def("is_used", &BlockAllocator::is_used, nb::arg("block"))
      .def_prop_ro("total", &BlockAllocator::total)
      .def_prop_ro("num_free", &BlockAllocator::num_free)
      .def_prop_ro("num_used", &BlockAllocator::num_used)
      .def("__repr__", [](const BlockAllocator& a) {
        return concat("BlockAllocator(total=", a.total(), ", num_used=", a.num_used(), ")");
      });
}

}  // namespace metrale_ext
