// The continuous-batching simulation (see serve_sim.hpp).
#include "serve_sim.hpp"

#include <algorithm>
#include <deque>
#include <random>
#include <stdexcept>
#include <string>

#include <chrono>
#include <cmath>

#include "backend.hpp"
#include "metrale/block_allocator.hpp"
#include "metrale/cpu.hpp"
#include "progress.hpp"

namespace metrale::cli {
namespace {

struct Request {
  int32_t arrival = 0;  // step at which it enters the queue
  int32_t prompt = 0;
  int32_t output = 0;
};

// One request stream per seed, identical for every format.
std::vector<Request> make_requests(const ServeSimConfig& c) {
  std::mt19937_64 rng(c.seed);
  std::exponential_distribution<double> gap(c.arrival_rate);
  std::uniform_int_distribution<int32_t> prompt(c.prompt_min, c.prompt_max), output(c.output_min, c.output_max);
  std::vector<Request> reqs;
  double t = 0.0;
  for (int32_t i = 0; i < c.num_requests; ++i) {
    t += gap(rng);
    Request r;
    r.arrival = int32_t(t);
    r.prompt = prompt(rng);
    r.output = output(rng);
    reqs.push_back(r);
  }
  return reqs;
}

// Random bf16 rows like the demo's (host_batch.cpp): bell-shaped in [-2, 2],
// and in K a few channels 12x larger. Their content only has to be plausible
// (the simulation measures capacity and speed; `metrale accuracy` measures error).
class RowSource {
 public:
  explicit RowSource(uint64_t seed) : rng_(seed) {}
  void fill(bf16* dst, int64_t rows, int64_t row_len, bool outliers) {
    std::uniform_real_distribution<float> u(-0.5f, 0.5f);
    for (int64_t i = 0; i < rows * row_len; ++i) {
      const float x = u(rng_) + u(rng_) + u(rng_) + u(rng_);
      dst[i] = codec::float_to_bf16(outliers && (i % row_len) % 41 == 7 ? 12.0f * x : x);
    }
  }

 private:
  std::mt19937_64 rng_;
};

struct Seq {
  int32_t req = 0;              // index into the request stream
  int32_t len = 0;              // tokens in the cache
  std::vector<int32_t> blocks;  // pages, in order: the sequence's block-table row
};

int32_t blocks_for(int32_t tokens, int32_t block_size) { return (tokens + block_size - 1) / block_size; }

// The per-tensor scales, calibrated once on a separate batch of rows, as an
// engine does before serving.
KvScales calibrate(const ServeSimConfig& cfg, KvFormat format) {
  RowSource calib(cfg.seed ^ 0xca11b7a7e5ull);
  const int64_t n = 256, row = int64_t(cfg.shape.num_kv_heads) * cfg.shape.head_dim;
  AlignedVector<bf16> k(size_t(n * row)), v(size_t(n * row));
  calib.fill(k.data(), n, row, true);
  calib.fill(v.data(), n, row, false);
  float ka = 0.0f, va = 0.0f;
  cpu::bf16_absmax(k.data(), n, row, row, &ka);
  cpu::bf16_absmax(v.data(), n, row, row, &va);
  return kv_scales_from_absmax(format, ka, va);
}

// The KV caches of a run (one K and V cache per layer, all layers sharing the
// block tables) and the two library calls made on them each step, on one
// backend. Inputs are host arrays copied into the backend's memory first
// (not timed: an engine's inputs would already be there); seconds() is the
// time spent in the library calls, each waited for.
class KvStore {
 public:
  KvStore(Backend& be, const LayerShape& shape, int32_t num_layers, const KvCacheLayout& layout,
          const KvScales& scales)
      : be_(be), shape_(shape), layout_(layout), scales_(scales), skipped_(be.alloc(sizeof(int32_t))) {
    layout_.validate();
    for (int32_t l = 0; l < num_layers; ++l) {
      k_.push_back(be.alloc(size_t(layout_.cache_bytes())));
      v_.push_back(be.alloc(size_t(layout_.cache_bytes())));
    }
    be.fill(skipped_.get(), 0, sizeof(int32_t));
  }

  // Writes `num_tokens` rows (kv_row() elements each) of K and V into `slots` of every layer.
  void write(const bf16* key, const bf16* value, const int64_t* slots, int64_t num_tokens) {
    const size_t rows = size_t(num_tokens) * size_t(kv_row());
    CacheWriteArgs w;
    w.key = key_.upload(be_, key, rows);
    w.key_stride = kv_row();
    w.value = value_.upload(be_, value, rows);
    w.value_stride = kv_row();
    w.slot_mapping = slots_.upload(be_, slots, size_t(num_tokens));
    w.num_tokens = num_tokens;
    w.skipped = static_cast<int32_t*>(skipped_.get());
    const auto t0 = std::chrono::steady_clock::now();
    for (size_t l = 0; l < k_.size(); ++l) {
      w.cache = view(l);
      be_.reshape_and_cache(w);
    }
    be_.synchronize();
    seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    int32_t skipped = 0;
    be_.download(&skipped, skipped_.get(), sizeof(skipped));
    if (skipped != 0) throw std::logic_error("serve-sim: a slot past the cache's capacity");
  }

  // Decodes one query (q_row() elements) per sequence in every layer, sequence i
  // attending to lens[i] tokens through row i of `tables` ([num_seqs, max_blocks]);
  // returns the number of NaN/Inf output elements.
  int64_t decode(const bf16* q, const int32_t* tables, int32_t max_blocks, const int32_t* lens, int32_t num_seqs) {
    const size_t out_elems = size_t(num_seqs) * size_t(q_row());
    AttnArgs a;
    a.q = q_.upload(be_, q, out_elems);
    a.q_stride = q_row();
    a.num_seqs = num_seqs;
    a.num_q_heads = shape_.num_q_heads;
    a.cache = view(0);
    a.block_tables = tables_.upload(be_, tables, size_t(num_seqs) * size_t(max_blocks));
    a.max_blocks_per_seq = max_blocks;
    a.seq_lens = lens_.upload(be_, lens, size_t(num_seqs));
    a.sm_scale = 1.0f / std::sqrt(float(shape_.head_dim));
    a.out = out_.reserve<bf16>(be_, out_elems);
    const AttnPlan plan =
        plan_attention(attention_problem(a, *std::max_element(lens, lens + num_seqs)), be_.attention_target());
    const SplitKWorkspace ws{workspace_.reserve<float>(be_, plan.workspace_bytes / sizeof(float) + 1),
                             plan.workspace_bytes, plan.num_splits};
    host_out_.resize(out_elems);
    int64_t nonfinite = 0;
    for (size_t l = 0; l < k_.size(); ++l) {
      be_.fill(a.out, 0xff, out_elems * sizeof(bf16));  // NaN poison
      a.cache = view(l);
      const auto t0 = std::chrono::steady_clock::now();
      be_.run_attention(plan, a, ws);
      be_.synchronize();
      seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      be_.download(host_out_.data(), a.out, out_elems * sizeof(bf16));
      for (const bf16 x : host_out_) nonfinite += !std::isfinite(codec::bf16_to_float(x));
    }
    return nonfinite;
  }

  double seconds() const { return seconds_; }

 private:
  // Backend memory that grows to the largest size asked for.
  class Staging {
   public:
    template <class T>
    T* upload(Backend& be, const T* host, size_t count) {
      T* d = reserve<T>(be, count);
      be.upload(d, host, count * sizeof(T));
      return d;
    }
    template <class T>
    T* reserve(Backend& be, size_t count) {
      if (bytes_ < count * sizeof(T)) {
        buf_ = be.alloc(count * sizeof(T));
        bytes_ = count * sizeof(T);
      }
      return static_cast<T*>(buf_.get());
    }

   private:
    Buffer buf_;
    size_t bytes_ = 0;
  };

  int64_t kv_row() const { return int64_t(shape_.num_kv_heads) * shape_.head_dim; }
  int64_t q_row() const { return int64_t(shape_.num_q_heads) * shape_.head_dim; }
  KvCacheView view(size_t l) const { return KvCacheView{layout_, k_[l].get(), v_[l].get(), scales_}; }

  Backend& be_;
  LayerShape shape_;
  KvCacheLayout layout_;
  KvScales scales_;
  std::vector<Buffer> k_, v_;
  Buffer skipped_;  // int32 counter of out-of-capacity slots (must stay 0)
  Staging key_, value_, slots_, q_, tables_, lens_, out_, workspace_;
  std::vector<bf16> host_out_;
  double seconds_ = 0.0;
};

void check_config(const ServeSimConfig& c) {
  auto need = [](bool ok, const std::string& what) {
    if (!ok) throw std::invalid_argument("serve-sim: " + what);
  };
  need(c.num_layers >= 1, "--layers must be >= 1");
  need(c.budget_mib > 0, "--budget-mib must be > 0");
  need(c.num_requests >= 0, "--requests must be >= 0");
  need(c.arrival_rate > 0, "--arrival-rate must be > 0");
  need(c.prompt_min >= 1 && c.prompt_min <= c.prompt_max, "need 1 <= prompt min <= prompt max");
  need(c.output_min >= 1 && c.output_min <= c.output_max, "need 1 <= output min <= output max");
  need(c.max_seqs >= 1, "--max-seqs must be >= 1");
}

// One run's scheduler over a store: the request stream, the waiting queue,
// the running sequences and their pages. Each step admits what fits, gives
// full sequences a page (preempting the youngest when none is free), writes
// and decodes one token per running sequence and retires the finished ones;
// the counts go to `res`.
class ServeLoop {
 public:
  ServeLoop(const ServeSimConfig& cfg, KvStore& store, int32_t num_blocks, ServeSimResult& res)
      : cfg_(cfg),
        store_(store),
        res_(res),
        alloc_(num_blocks),
        // Admission keeps ~1% of the pages free so running sequences can grow
        // without immediate preemption (vLLM's watermark).
        watermark_(std::max<int32_t>(1, alloc_.total() / 100)),
        reqs_(make_requests(cfg)),
        generated_(reqs_.size(), 0),
        first_admit_(reqs_.size(), -1),
        rows_(cfg.seed + 17) {}

  bool done() const { return res_.finished + res_.rejected >= cfg_.num_requests || res_.steps >= cfg_.max_steps; }

  void step() {
    const int32_t step = res_.steps;
    while (next_req_ < reqs_.size() && reqs_[next_req_].arrival <= step) waiting_.push_back(int32_t(next_req_++));
    admit(step);
    grow();
    if (!running_.empty()) {
      decode();
      retire();
    }
    ++res_.steps;
  }

  // The averages over the steps run; frees what max_steps left running.
  void finish() {
    for (Seq& s : running_) release(s);
    res_.mean_seqs = res_.steps ? double(seq_sum_) / res_.steps : 0.0;
    res_.saturated_seqs = res_.saturated_steps ? double(saturated_sum_) / res_.saturated_steps : 0.0;
    res_.mean_used_blocks = res_.steps ? double(used_sum_) / res_.steps : 0.0;
    res_.mean_wait_steps = admitted_ ? double(wait_sum_) / double(admitted_) : 0.0;
    res_.final_used_blocks = alloc_.num_used();
  }

 private:
  int32_t block_size() const { return cfg_.shape.block_size; }
  int64_t kv_row() const { return int64_t(cfg_.shape.num_kv_heads) * cfg_.shape.head_dim; }
  int64_t q_row() const { return int64_t(cfg_.shape.num_q_heads) * cfg_.shape.head_dim; }

  void release(Seq& s) {
    for (int32_t b : s.blocks) alloc_.free(b);
    s.blocks.clear();
  }

  // First come, first served, while the prompt plus the first generated
  // token fit above the watermark; the admitted prompt (and a preempted
  // request's output so far) is written.
  void admit(int32_t step) {
    const int32_t B = block_size();
    while (!waiting_.empty() && int32_t(running_.size()) < cfg_.max_seqs) {
      const int32_t r = waiting_.front();
      const int32_t ctx = reqs_[size_t(r)].prompt + generated_[size_t(r)];  // a preempted one recomputes its output
      const int32_t need = blocks_for(ctx + 1, B);
      if (need > alloc_.total()) {  // can never fit: reject rather than block the queue forever
        waiting_.pop_front();
        ++res_.rejected;
        continue;
      }
      if (alloc_.num_free() < need + (running_.empty() ? 0 : watermark_)) break;
      waiting_.pop_front();
      Seq s;
      s.req = r;
      s.len = ctx;
      slots_.clear();
      for (int32_t pos = 0; pos < ctx; ++pos) {
        if (pos % B == 0) s.blocks.push_back(*alloc_.allocate());  // checked above: enough pages are free
        slots_.push_back(int64_t(s.blocks.back()) * B + pos % B);
      }
      key_.resize(size_t(ctx * kv_row()));
      value_.resize(key_.size());
      rows_.fill(key_.data(), ctx, kv_row(), true);
      rows_.fill(value_.data(), ctx, kv_row(), false);
      store_.write(key_.data(), value_.data(), slots_.data(), int64_t(slots_.size()));
      res_.prefill_tokens += ctx;
      if (first_admit_[size_t(r)] < 0) {
        first_admit_[size_t(r)] = step;
        wait_sum_ += step - reqs_[size_t(r)].arrival;
        ++admitted_;
      }
      running_.push_back(std::move(s));
    }
  }

  // A sequence whose last page is full needs a new one; when none is free
  // the youngest sequence is preempted (its pages freed, its request
  // requeued at the front to be recomputed).
  void grow() {
    for (size_t i = 0; i < running_.size();) {
      if (running_[i].len % block_size() != 0) {
        ++i;
        continue;
      }
      if (std::optional<int32_t> b = alloc_.allocate()) {
        running_[i].blocks.push_back(*b);
        ++i;
        continue;
      }
      Seq& victim = running_.back();
      release(victim);
      waiting_.push_front(victim.req);
      running_.pop_back();
      ++res_.preemptions;
      // If the victim was sequence i itself, the loop ends; else retry i.
    }
  }

  // One new token per running sequence: its K/V written, then the batch decoded.
  void decode() {
    const int32_t B = block_size();
    const size_t n = running_.size();
    slots_.clear();
    lens_.clear();
    int32_t max_blocks = 0;
    for (Seq& s : running_) {
      slots_.push_back(int64_t(s.blocks[size_t(s.len / B)]) * B + s.len % B);
      lens_.push_back(++s.len);
      max_blocks = std::max(max_blocks, int32_t(s.blocks.size()));
    }
    key_.resize(n * size_t(kv_row()));
    value_.resize(key_.size());
    q_.resize(n * size_t(q_row()));
    rows_.fill(key_.data(), int64_t(n), kv_row(), true);
    rows_.fill(value_.data(), int64_t(n), kv_row(), false);
    rows_.fill(q_.data(), int64_t(n), q_row(), false);
    store_.write(key_.data(), value_.data(), slots_.data(), int64_t(slots_.size()));
    tables_.assign(n * size_t(max_blocks), 0);
    for (size_t i = 0; i < n; ++i)
      std::copy(running_[i].blocks.begin(), running_[i].blocks.end(), &tables_[i * max_blocks]);
    res_.nonfinite += store_.decode(q_.data(), tables_.data(), max_blocks, lens_.data(), int32_t(n));
    res_.decode_tokens += int64_t(n);

    res_.peak_seqs = std::max(res_.peak_seqs, int32_t(n));
    seq_sum_ += int64_t(n);
    res_.peak_used_blocks = std::max<int64_t>(res_.peak_used_blocks, alloc_.num_used());
    used_sum_ += alloc_.num_used();
    if (!waiting_.empty()) {
      saturated_sum_ += int64_t(n);
      ++res_.saturated_steps;
    }
  }

  // The sequences that produced their last token free their pages.
  void retire() {
    for (size_t i = 0; i < running_.size();) {
      Seq& s = running_[i];
      if (++generated_[size_t(s.req)] >= reqs_[size_t(s.req)].output) {
        release(s);
        running_.erase(running_.begin() + std::ptrdiff_t(i));
        ++res_.finished;
      } else {
        ++i;
      }
    }
  }

  const ServeSimConfig& cfg_;
  KvStore& store_;
  ServeSimResult& res_;
  BlockAllocator alloc_;
  const int32_t watermark_;
  const std::vector<Request> reqs_;
  std::vector<int32_t> generated_, first_admit_;
  std::deque<int32_t> waiting_;  // request ids; preempted ones go back to the front
  std::vector<Seq> running_;     // admission order: the last is the youngest
  RowSource rows_;
  AlignedVector<bf16> key_, value_, q_;
  std::vector<int64_t> slots_;
  std::vector<int32_t> tables_, lens_;
  size_t next_req_ = 0;
  int64_t admitted_ = 0, wait_sum_ = 0, seq_sum_ = 0, used_sum_ = 0, saturated_sum_ = 0;
};

}  // namespace

ServeSimResult run_serve_sim(const ServeSimConfig& cfg, KvFormat format, Backend& be, bool progress) {
  check_config(cfg);
  ServeSimResult res;
  res.format = format;
  res.block_bytes = 2 * make_layout(format, cfg.shape, 1).page_stride_bytes * cfg.num_layers;
  res.num_blocks = int64_t(cfg.budget_mib * double(1 << 20)) / res.block_bytes;
  if (res.num_blocks < 1)
    throw std::invalid_argument("serve-sim: --budget-mib holds no page of " + std::to_string(res.block_bytes) +
                                " bytes");
  if (res.num_blocks > INT32_MAX) throw std::invalid_argument("serve-sim: --budget-mib too large");

  KvStore store(be, cfg.shape, cfg.num_layers, make_layout(format, cfg.shape, res.num_blocks), calibrate(cfg, format));
  ServeLoop loop(cfg, store, int32_t(res.num_blocks), res);
  Progress bar(std::string("serve-sim ") + to_string(format), cfg.num_requests);
  while (!loop.done()) {
    loop.step();
    if (progress) bar.update(res.finished + res.rejected);
  }
  loop.finish();
  res.library_seconds = store.seconds();
  return res;
}

}  // namespace metrale::cli
