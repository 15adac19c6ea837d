// Context-parallel decode: the NCCL exchange (target metrale_nccl, kept out
// of the core library). One process (or one thread) per GPU; the
// communicator is the caller's.
#include <nccl.h>

#include <string>

#include "metrale/context_parallel.hpp"
#include "metrale/error.hpp"

namespace metrale::nccl {

namespace {
void nccl_check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) throw CudaError(std::string("metrale: ") + what + ": " + ncclGetErrorString(r));
}
}  // namespace

void cp_all_gather(const cp::CpLayout& L, int32_t rank, float* gathered, ncclComm* comm, cuda::Stream stream) {
  L.validate();
  METRALE_CHECK_ARG(comm != nullptr, "comm", "null", "an initialised ncclComm_t");
  int n = 0, me = -1;
  nccl_check(ncclCommCount(comm, &n), "ncclCommCount");
  nccl_check(ncclCommUserRank(comm, &me), "ncclCommUserRank");
  METRALE_CHECK_ARG(n == L.num_ranks, "L.num_ranks", L.num_ranks,
                    "the communicator's size = " + std::to_string(n));
  METRALE_CHECK_ARG(me == rank, "rank", rank, "the communicator's rank = " + std::to_string(me));
  METRALE_CHECK_ARG(gathered != nullptr, "gathered", "null", "a device buffer of L.gathered_floats()");
  if (L.rank_floats() == 0) return;
  // In place: the send buffer is this rank's slot of the receive buffer.
  nccl_check(ncclAllGather(gathered + size_t(rank) * L.rank_floats(), gathered, L.rank_floats(), ncclFloat32, comm,
                           reinterpret_cast<cudaStream_t>(stream)),
             "ncclAllGather");
}

void cp_decode(const cp::CpLayout& L, int32_t rank, const AttnArgs& rank_args, const cp::EdgeSlice* edges,
               float* gathered, float* merged, ncclComm* comm, cuda::Stream stream) {
  L.validate();
  METRALE_CHECK_ARG(rank >= 0 && rank < L.num_ranks, "rank", rank, "in [0, L.num_ranks)");
  METRALE_CHECK_ARG(gathered != nullptr, "gathered", "null", "a device buffer of L.gathered_floats()");
  if (L.num_seqs > 0) cuda::cp_rank_states(L, rank_args, edges, gathered + size_t(rank) * L.rank_floats(), stream);
  cp_all_gather(L, rank, gathered, comm, stream);
  cuda::cp_merge(L, gathered, merged, rank_args.out, stream);
}

}  // namespace metrale::nccl
