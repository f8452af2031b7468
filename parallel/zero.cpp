// parallel/zero.cpp -- units, shards, the gradient hooks, ZeRO-3's gathers, the sharded step; the
// whole-parameter views for checkpoints and the reports are zero_state.cpp's.
#include "parallel/zero.h"

#include <algorithm>
#include <unordered_map>

#include <ATen/ATen.h>
#include <c10/core/StorageImpl.h>

#include "distributed/device.h"
#include "distributed/device_check.h"
#include "distributed/error.h"
#include "distributed/host_memory.h"
#include "kernels/adamw.h"
#include "models/gpt.h"
#include "optim/cpu_adamw.h"
#include "parallel/grad_ready.h"
#include "parallel/host_accumulator.h"
#include "parallel/host_worker.h"
#include "parallel/upload_stream.h"
#include "parallel/zero_unit.h"

namespace kiln {

namespace {

// Frees / re-allocates a tensor's storage in place: its views (the model's parameters) stay
// valid and see the new allocation. The same allocator the tensor was made with is used.
void free_storage(const at::Tensor& t) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(at::DataPtr(nullptr, t.device()));
  s->set_nbytes(0);
}
void alloc_storage(const at::Tensor& t) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  const size_t nbytes = static_cast<size_t>(t.numel()) * t.element_size();
  s->set_data_ptr_noswap(s->allocator()->allocate(nbytes));
  s->set_nbytes(nbytes);
}

// The units of a GPT, in order. The whole model: unit 0 = wte, wpe, ln_f, lm_head (those it has);
// unit 1 + i = block i.
// A pipeline stage (parallel/pipeline.h): wte alone first, where the stage holds it (the first and
// the last stage each hold a copy, whose reduced gradient shards the tied-embedding sync adds
// element by element, so both copies must be laid out and sharded alike); then wpe and ln_f,
// where held, as one unit; then the stage's blocks. The blocks' units are the last
// blocks().size() units.
std::vector<std::vector<at::Tensor>> units_of(GPT& model) {
  std::vector<std::vector<at::Tensor>> units;
  const bool stage = !model.shard().whole_model();
  std::vector<at::Tensor> outer;
  if (model.wte.defined()) {
    if (stage) units.push_back({model.wte});
    else outer.push_back(model.wte);
  }
  if (model.wpe.defined()) outer.push_back(model.wpe);
  if (model.ln_f)
    for (const auto& p : model.ln_f->parameters()) outer.push_back(p);
  if (model.lm_head.defined()) outer.push_back(model.lm_head);  // the untied output layer
  if (!outer.empty()) units.push_back(std::move(outer));
  for (const auto& b : model.blocks()) units.push_back(b->parameters());
  size_t covered = 0;
  for (const auto& u : units) covered += u.size();
  if (covered != model.parameters().size()) {
    throw Error("zero: the model has " + std::to_string(model.parameters().size()) + " parameters, its units " +
                std::to_string(covered));
  }
  return units;
}

// The units with each one's expert parameters (is_expert) split off into a unit after it; each
// with the index of the unit of units_of it came from.
struct SplitUnit {
  std::vector<at::Tensor> params;
  bool expert = false;
  size_t origin = 0;
};
std::vector<SplitUnit> split_experts(std::vector<std::vector<at::Tensor>> units, const std::function<bool(const at::Tensor&)>& is_expert) {
  std::vector<SplitUnit> out;
  for (size_t i = 0; i < units.size(); ++i) {
    std::vector<at::Tensor> dense, experts;
    for (auto& p : units[i]) (is_expert && is_expert(p) ? experts : dense).push_back(std::move(p));
    if (!dense.empty()) out.push_back({std::move(dense), false, i});
    if (!experts.empty()) out.push_back({std::move(experts), true, i});
  }
  return out;
}

}  // namespace

ZeroEngine::ZeroEngine(GPT& model, c10::Device device, std::shared_ptr<Communicator> dp, ZeroConfig cfg,
                       AdamWConfig adam)
    : model_(model), device_(device), dp_(std::move(dp)), cfg_(cfg), adam_(adam) {
  if (cfg_.stage < 1 || cfg_.stage > 3) throw ConfigError("zero: stage must be 1, 2 or 3");
  if (cfg_.offload == Offload::All && cfg_.stage != 3) throw ConfigError("--offload all needs --zero 3");
  if (cfg_.delay_from < 0) throw ConfigError("--offload-delay-from must be 0 or more");
  if (cfg_.delayed_update && cfg_.offload != Offload::Optimizer)
    throw ConfigError("--offload-delayed-update needs --offload optimizer (the working weights the delay keeps are the device's)");
  if (cfg_.is_expert && (!cfg_.expert_dp || !cfg_.ep)) {
    throw Error("zero: expert parallelism needs the expert-data-parallel and ep groups");
  }
  const bool pin = pin_for(device_);
  if (cfg_.param_dtype != at::kFloat && cfg_.param_dtype != at::kBFloat16 && cfg_.param_dtype != at::kHalf)
    throw ConfigError("zero: working weights must be fp32, bf16 or fp16");
  if (cfg_.reduce_dtype != at::kFloat && cfg_.reduce_dtype != at::kBFloat16)
    throw ConfigError("zero: the reduction dtype must be fp32 or bf16");
  const auto dev = at::TensorOptions().dtype(at::kFloat).device(device_);
  const auto pdev = dev.dtype(cfg_.param_dtype);
  at::NoGradGuard no_grad;

  std::vector<std::vector<at::Tensor>> whole_units = units_of(model_);
  const size_t first_block_unit = whole_units.size() - model_.blocks().size();
  block_units_.assign(model_.blocks().size(), {});
  std::vector<int>& block_chunk = block_chunk_;  // blocks() order: chunk by chunk
  for (size_t c = 0; c < model_.shard().chunks.size(); ++c)
    for (int64_t i = model_.shard().chunks[c].begin; i < model_.shard().chunks[c].end; ++i) block_chunk.push_back(static_cast<int>(c));
  for (auto& [params, expert, origin] : split_experts(std::move(whole_units), cfg_.is_expert)) {
    if (origin >= first_block_unit) block_units_[origin - first_block_unit].push_back(units_.size());
    // Its chunk: a block's; the outer units go with the embedding (chunk 0) or the head (the last).
    unit_chunk_.push_back(origin >= first_block_unit ? block_chunk[origin - first_block_unit]
                          : model_.shard().embedding ? 0
                                                     : static_cast<int>(model_.shard().chunks.size()) - 1);
    if (origin < first_block_unit) outer_units_.push_back(units_.size());
    auto u = std::make_unique<Unit>();
    u->params = std::move(params);
    u->expert = expert;
    u->group = expert ? cfg_.expert_dp.get() : dp_.get();
    const int64_t n = u->group->size(), r = u->group->rank();
    for (const auto& p : u->params) {
      if (!p.device().is_cpu() || p.scalar_type() != at::kFloat)
        throw Error("zero: the model must be built on the host in fp32 before the engine takes it");
      u->offsets.push_back(u->numel);
      u->numel += p.numel();
    }
    const int64_t quantum = n * cfg_.align;
    u->padded = (u->numel + quantum - 1) / quantum * quantum;
    u->shard = u->padded / n;
    const int64_t lo = r * u->shard, hi = lo + u->shard;
    for (size_t k = 0; k < u->params.size(); ++k) {
      // The parameter's elements in runs of one weight, each cut to this rank's shard.
      std::vector<std::pair<int64_t, double>> runs;
      if (cfg_.count_weights) runs = cfg_.count_weights(u->params[k]);
      if (runs.empty()) runs = {{u->params[k].numel(), 1.0}};
      int64_t start = u->offsets[k];
      for (const auto& [length, weight] : runs) {
        const int64_t a = std::max(lo, start), b = std::min(hi, start + length);
        if (a < b) u->segments.push_back({a - lo, b - a, u->params[k].dim() >= 2, weight});
        start += length;
      }
      if (start != u->offsets[k] + u->params[k].numel())
        throw Error("zero: count_weights' runs do not cover a parameter of " + std::to_string(u->params[k].numel()));
    }

    // The whole unit, flattened on the host. The optimizer state starts at zero (a resume loads
    // its own afterwards, load_param).
    auto whole = at::zeros({u->padded}, at::kFloat);
    for (size_t k = 0; k < u->params.size(); ++k) {
      const auto& p = u->params[k];
      whole.narrow(0, u->offsets[k], p.numel()).copy_(p.reshape({-1}));
    }
    auto own = [&](const at::Tensor& t) { return t.narrow(0, lo, u->shard); };

    // Parameters: the whole unit on the device (stages 1, 2), or the shard (stage 3).
    // In the working dtype (16-bit: the fp32 values rounded; the masters keep them exactly).
    if (cfg_.stage < 3) {
      u->flat = at::empty({u->padded}, pdev);
      u->flat.copy_(whole);
    } else {
      u->flat = at::empty({u->padded}, pdev);
      u->shard_params = cfg_.offload == Offload::All ? host_buffer(u->shard, pin, cfg_.param_dtype) : at::empty({u->shard}, pdev);
      u->shard_params.copy_(own(whole));
    }
    for (size_t k = 0; k < u->params.size(); ++k) {
      auto& p = u->params[k];
      p.set_data(u->flat.narrow(0, u->offsets[k], p.numel()).view(p.sizes()));
    }
    if (cfg_.stage == 3) {
      free_storage(u->flat);
      u->state = Unit::State::Released;
    }

    // Gradients.
    if (streamed()) {
      u->grad_shard = cfg_.offload == Offload::All ? host_buffer(u->shard, pin).zero_() : at::zeros({u->shard}, dev);
    } else {
      // fp32 weights: the parameters' .grad are views of the buffer and autograd accumulates into
      // it. 16-bit weights: the hook adds each 16-bit gradient into it (on_grad_ready).
      u->grad_full = at::zeros({u->padded}, dev);
      for (size_t k = 0; k < u->params.size() && !sixteen(); ++k) {
        auto& p = u->params[k];
        p.mutable_grad() = u->grad_full.narrow(0, u->offsets[k], p.numel()).view(p.sizes());
      }
      u->grad_shard = own(u->grad_full);
    }

    // Optimizer state. On the host only the buffers a GPU copies to or from are page-locked
    // (the master shard, the gradient shard); the moments are the CPU AdamW's alone.
    const bool on_host = cfg_.offload != Offload::None;
    for (at::Tensor* m : {&u->exp_avg, &u->exp_avg_sq}) {
      *m = on_host ? host_buffer(u->shard, /*pinned=*/false) : at::empty({u->shard}, dev);
      m->zero_();
    }
    if (cfg_.offload == Offload::Optimizer || (cfg_.offload == Offload::All && sixteen())) {
      u->master = host_buffer(u->shard, pin && cfg_.offload == Offload::Optimizer);
      u->master.copy_(own(whole));
    } else if (cfg_.offload == Offload::All) {
      u->master = u->shard_params;
    } else if (sixteen()) {
      u->master = at::empty({u->shard}, dev);
      u->master.copy_(own(whole));
    }
    if (cfg_.offload == Offload::Optimizer && sixteen()) u->upload = host_buffer(u->shard, pin, cfg_.param_dtype);
    if (on_host) {
      u->host_grad = u->grad_shard.device().is_cpu() && cfg_.offload == Offload::All && streamed()
                         ? u->grad_shard
                         : host_buffer(u->shard, pin).zero_();
    }
    u->pending = static_cast<int64_t>(u->params.size());
    units_.push_back(std::move(u));
  }

  step_t_ = at::zeros({}, dev);
  for (auto& up : units_) {
    Unit* u = up.get();
    for (size_t k = 0; k < u->params.size(); ++k) hooks_.add(u->params[k], [this, u, k] { on_grad_ready(*u, k); }, "zero");
  }
  if (cfg_.offload != Offload::None) host_ = std::make_unique<HostWorker>(device_);
  if (cfg_.offload == Offload::All) uploads_ = std::make_unique<UploadStream>(device_);
  if (cfg_.offload != Offload::None) {  // offload all's gradient sums; offload optimizer's downloads
    int64_t largest = 0;
    for (const auto& u : units_) largest = std::max(largest, u->shard);
    host_adds_ = std::make_unique<HostAccumulator>(*host_, device_, largest);
  }

  if (cfg_.stage == 3) {
    // Gather each block just before its forward (prefetching the next), free it after; gather
    // it again when backward reaches its output (prefetching the previous one). A block is its
    // units: one, or under --ep its dense part (over dp) and its experts (over expert-dp).
    std::unordered_map<const BlockImpl*, size_t> block_of;
    const auto blocks = model_.blocks();
    for (size_t i = 0; i < blocks.size(); ++i) block_of[blocks[i].get()] = i;
    inner_runner_ = model_.block_runner;
    auto inner = inner_runner_;
    model_.block_runner = [this, inner, block_of](BlockImpl& block, const at::Tensor& x) {
      const size_t i = block_of.at(&block), n = block_units_.size();
      for (const size_t u : block_units_[i]) wait_gathered(*units_[u]);
      if (i + 1 < n && block_chunk_[i + 1] == block_chunk_[i])  // the next block of this chunk
        for (const size_t u : block_units_[i + 1]) gather_async(*units_[u]);
      at::Tensor y = inner ? inner(block, x) : block.forward(x);
      // The last block's backward comes right after its forward: it stays gathered (FSDP's
      // reshard_after_forward=False for the root's last module) instead of being released and
      // gathered again with nothing to hide it. Without autograd (evaluation) it is released.
      if (!(i + 1 == n && at::GradMode::is_enabled()))
        for (const size_t u : block_units_[i]) release(*units_[u]);
      if (y.requires_grad()) {
        y.register_hook([this, i](const at::Tensor&) {
          for (const size_t u : block_units_[i]) wait_gathered(*units_[u]);
          if (i > 0 && block_chunk_[i - 1] == block_chunk_[i])
            for (const size_t u : block_units_[i - 1]) gather_async(*units_[u]);
        });
      }
      return y;
    };
  }
}

ZeroEngine::~ZeroEngine() {
  model_.block_runner = inner_runner_;
  try {
    if (host_) host_->drain();
  } catch (...) {
  }
  for (auto* u : in_flight_) {
    try {
      if (u->rs_work) u->rs_work->wait();
    } catch (...) {
    }
  }
}

bool ZeroEngine::alone(const Unit& u) { return u.expert && u.group->size() == 1; }

bool ZeroEngine::streamed() const {
  return cfg_.stage >= 2 && (cfg_.accum == ZeroAccum::Reduce || cfg_.grad_accum == 1);
}

at::Tensor ZeroEngine::param_shard(Unit& u) const {
  if (cfg_.stage == 3) return u.shard_params;
  return u.flat.narrow(0, static_cast<int64_t>(u.group->rank()) * u.shard, u.shard);
}

int64_t ZeroEngine::padded_numel() const {
  int64_t total = 0;
  for (const auto& u : units_) total += u->padded;
  return total;
}

// ---- ZeRO-3 gathers ------------------------------------------------------------------------

void ZeroEngine::gather_async(Unit& u) {
  if (u.state != Unit::State::Released) return;
  // Offload: the shard the gather reads is the host update's output. Delayed: the published
  // shard, which no pending update writes.
  if (!delaying_) finish_update(u);
  alloc_storage(u.flat);
  auto issue = [this, &u] {
    u.ag_src = to_device(u.shard_params, device_, /*non_blocking=*/true);
    u.ag_work = u.group->all_gather(u.flat, u.ag_src);
  };
  // Offload all: the host shard's copy up and the gather on the upload stream, beside the
  // compute stream's kernels (parallel/upload_stream.h); else on the compute stream.
  if (uploads_) u.uploaded = uploads_->run({u.flat}, issue);
  else issue();
  u.state = Unit::State::Gathering;
}

void ZeroEngine::wait_gathered(Unit& u) {
  if (u.state == Unit::State::Released) gather_async(u);
  if (u.state == Unit::State::Gathering) {
    u.ag_work->wait();
    u.ag_work.reset();
    UploadStream::join(u.uploaded);  // the compute stream after the upload stream's copy and gather
    u.uploaded.reset();
    u.ag_src = at::Tensor();
    u.state = Unit::State::Gathered;
  }
}

void ZeroEngine::release(Unit& u) {
  if (cfg_.stage != 3 || u.state == Unit::State::Released) return;
  if (u.state == Unit::State::Gathering) wait_gathered(u);
  free_storage(u.flat);
  u.state = Unit::State::Released;
}

// ---- gradients -----------------------------------------------------------------------------

void ZeroEngine::begin_micro(int64_t micro, int chunk) {
  last_micro_ = micro + 1 == cfg_.grad_accum;
  if (micro == 0) {
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < units_.size(); ++i) {
      if (!in_chunk(i, chunk)) continue;
      Unit& u = *units_[i];
      u.sq_valid = false;
      if (host_sums()) u.fresh = true;  // the step's first add copies (host_accumulator.h)
      else (u.grad_full.defined() && !streamed() ? u.grad_full : u.grad_shard).zero_();
    }
  }
  for (size_t i = 0; i < units_.size(); ++i) {
    if (!in_chunk(i, chunk)) continue;
    units_[i]->pending = static_cast<int64_t>(units_[i]->params.size());
    units_[i]->reduced = false;
  }
  if (cfg_.stage == 3) {
    // The outer units (the embedding, ln_f, the head) stay gathered through the micro-step. A
    // pipeline stage's forwards come apart from this backward (begin_forward), which the
    // blocks' output hooks regather from the last block down: nothing to prefetch here.
    for (const size_t u : outer_units_)
      if (in_chunk(u, chunk)) wait_gathered(*units_[u]);
    if (model_.shard().whole_model() && !block_units_.empty())
      for (const size_t u : block_units_[0]) gather_async(*units_[u]);
  }
}

void ZeroEngine::begin_forward(int chunk) {
  if (cfg_.stage != 3) return;
  for (const size_t u : outer_units_)
    if (in_chunk(u, chunk)) wait_gathered(*units_[u]);
  for (size_t i = 0; i < block_units_.size(); ++i) {  // the chunk's first block, prefetched
    if (chunk >= 0 && block_chunk_[i] != chunk) continue;
    for (const size_t u : block_units_[i]) gather_async(*units_[u]);
    break;
  }
}

void ZeroEngine::on_grad_ready(Unit& u, size_t k) {
  at::NoGradGuard no_grad;
  if (streamed() || sixteen()) {
    // Move the gradient into the unit's fp32 buffer (streamed: the reduction buffer, allocated by
    // the unit's first one; else the accumulation buffer). Streamed, the buffer is not zeroed: each
    // parameter's first gradient of the micro-step is copied in (one write, where zeroing and
    // adding wrote twice and read once more), the padding zeroed alone, and the slices of
    // parameters that got none zeroed when the reduction launches.
    auto& p = u.params[k];
    if (streamed() && !u.grad_full.defined()) {
      u.grad_full = at::empty({u.padded}, p.grad().options().dtype(at::kFloat));
      if (u.padded > u.numel) u.grad_full.narrow(0, u.numel, u.padded - u.numel).zero_();
      u.landed.assign(u.params.size(), false);
    }
    auto slice = u.grad_full.narrow(0, u.offsets[k], p.numel()).view(p.sizes());
    if (streamed() && !u.landed[k]) slice.copy_(p.grad());
    else slice.add_(p.grad());
    if (streamed()) u.landed[k] = true;
    p.mutable_grad().reset();
  }
  if (--u.pending == 0) {
    if (streamed() || last_micro_) launch_reduction(u);
    release(u);  // ZeRO-3: backward is done with the unit's parameters
  }
}

void ZeroEngine::launch_reduction(Unit& u) {
  u.reduced = true;
  if (streamed() && !u.grad_full.defined()) {
    u.grad_full = at::zeros({u.padded}, at::TensorOptions().dtype(at::kFloat).device(device_));
  } else if (streamed()) {
    for (size_t k = 0; k < u.params.size(); ++k)  // parameters this backward left without a gradient
      if (!u.landed[k]) u.grad_full.narrow(0, u.offsets[k], u.params[k].numel()).zero_();
  }
  if (alone(u)) {  // the mean over one rank: the gradient itself (grad_shard is the whole unit)
    at::NoGradGuard no_grad;
    if (streamed()) {
      // Offload all: grad_shard is on the host and grad_full on the device (an add_ between them
      // fails on a GPU): the host accumulator's copy and add, as the reduced units' shards take.
      if (host_sums()) {
        finish_update(u);  // the assign's copy lands on the stream's time: the last update must be done
        host_adds_->add(u.grad_full, u.grad_shard, u.fresh);
        u.fresh = false;
      } else {
        u.grad_shard.add_(u.grad_full);
      }
      u.grad_full = at::Tensor();
    }
    return;
  }
  if (cfg_.reduce_dtype != at::kFloat) {
    // The wire copy; a streamed unit's fp32 buffer is no longer needed once it is made.
    u.rs_in = u.grad_full.to(cfg_.reduce_dtype);
    if (streamed()) u.grad_full = at::Tensor();
    u.rs_out = at::empty({u.shard}, u.rs_in.options());
    u.rs_work = u.group->reduce_scatter(u.rs_out, u.rs_in, ReduceOp::Avg);
  } else if (streamed()) {
    u.rs_out = at::empty({u.shard}, u.grad_full.options());
    u.rs_work = u.group->reduce_scatter(u.rs_out, u.grad_full, ReduceOp::Avg);
  } else {
    // In place: the result lands in this rank's chunk of the full buffer, which grad_shard views.
    u.rs_work = u.group->reduce_scatter(u.grad_shard, u.grad_full, ReduceOp::Avg);
  }
  in_flight_.push_back(&u);
  wait_reductions(static_cast<size_t>(std::max(cfg_.max_in_flight, 0)));
}

void ZeroEngine::finish_reduction(Unit& u) {
  u.rs_work->wait();
  u.rs_work.reset();
  u.rs_in = at::Tensor();
  at::NoGradGuard no_grad;
  if (streamed()) {
    // Offload all: the host shard takes the sum off this thread (parallel/host_accumulator.h);
    // the reduction's output may go at once, its copy ordered on the stream.
    if (host_sums()) {
      finish_update(u);
      host_adds_->add(u.rs_out.to(at::kFloat), u.grad_shard, u.fresh);
      u.fresh = false;
      if (last_micro_ && !u.expert) post_norm(u);  // the shard is final (experts: after their 1/ep)
    } else {
      u.grad_shard.add_(u.rs_out);
    }
    u.rs_out = at::Tensor();
    u.grad_full = at::Tensor();  // the unit's full gradient exists only while it is reduced
  } else if (u.rs_out.defined()) {  // a bf16 reduction of the full buffer: its mean into the fp32 shard
    u.grad_shard.copy_(u.rs_out);
    u.rs_out = at::Tensor();
  }
  if (last_micro_ && !u.expert) download(u);  // the step's gradient shard is final (experts: end_micro)
}

void ZeroEngine::download(Unit& u) {
  // Offload optimizer: the final gradient shard to the host now, on the accumulator's copy stream,
  // so the copy overlaps the rest of the backward instead of waiting for the step.
  if (cfg_.offload != Offload::Optimizer) return;
  finish_update(u);  // the host copy's last reader (the previous update) is done
  host_adds_->add(u.grad_shard, u.host_grad, /*assign=*/true);
  u.downloaded = true;
}

void ZeroEngine::wait_reductions(size_t keep) {
  while (in_flight_.size() > keep) {
    Unit* u = in_flight_.front();
    in_flight_.erase(in_flight_.begin());
    finish_reduction(*u);
  }
}

void ZeroEngine::end_micro(int chunk) {
  // Units whose gradients did not all land (a parameter unused in this backward) are reduced
  // now, in unit order: every rank has the same graph, so every rank reaches the same decision.
  for (size_t i = 0; i < units_.size(); ++i) {
    Unit& u = *units_[i];
    if (in_chunk(i, chunk) && !u.reduced && (streamed() || last_micro_)) launch_reduction(u);
  }
  wait_reductions(0);
  if (last_micro_ && cfg_.is_expert) {
    // The experts' mean over expert_dp, times 1 / ep: the mean over dp (ZeroConfig::is_expert).
    // Offload all: after the host accumulator's adds have landed (the multiply would otherwise
    // race the worker's last adds, and the gradients come out ep times too large).
    if (host_sums()) host_adds_->drain();
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < units_.size(); ++i) {
      if (!units_[i]->expert || !in_chunk(i, chunk)) continue;
      units_[i]->grad_shard.mul_(1.0 / static_cast<double>(cfg_.ep->size()));
      download(*units_[i]);
      post_norm(*units_[i]);
    }
  }
  for (size_t i = 0; i < units_.size(); ++i)
    if (in_chunk(i, chunk)) release(*units_[i]);
}

at::Tensor ZeroEngine::grad_shard_of(const at::Tensor& param) const {
  settle();
  for (const auto& u : units_) {
    if (u->params.size() != 1 || !u->params[0].is_same(param)) continue;
    u->downloaded = false;  // the caller changes it (the tied embedding's sync): the step copies it again
    u->sq_valid = false;    // ... and the norm sums it afresh
    return u->grad_shard;
  }
  throw Error("zero: grad_shard_of: the parameter is not alone in a unit");
}

namespace {
// A unit's squared gradient norm, in the pieces local_grad_sq_norm sums: the whole shard, or each
// segment times its weight (ZeroConfig::count_weights). On the CPU in double: LibTorch's CPU fp32
// norm of a long vector is off by up to 1e-6 relative (measured on the tiny model); CUDA reduces
// in a tree, accurately in fp32.
std::vector<at::Tensor> sq_norm_parts(const at::Tensor& g, const std::vector<std::pair<int64_t, int64_t>>& runs,
                                      const std::vector<double>& weights) {
  auto sq_norm = [](const at::Tensor& x) {
    return at::linalg_vector_norm(x, 2, at::OptionalIntArrayRef(), false, x.is_cpu() ? at::kDouble : at::kFloat)
        .square()
        .to(at::kDouble);
  };
  at::NoGradGuard no_grad;
  if (runs.empty()) return {sq_norm(g)};
  std::vector<at::Tensor> parts;
  for (size_t i = 0; i < runs.size(); ++i) parts.push_back(sq_norm(g.narrow(0, runs[i].first, runs[i].second)) * weights[i]);
  return parts;
}
}  // namespace

std::vector<at::Tensor> ZeroEngine::sq_parts(const Unit& u) const {
  std::vector<std::pair<int64_t, int64_t>> runs;
  std::vector<double> weights;
  if (cfg_.count_weights) {
    for (const auto& s : u.segments) {
      runs.push_back({s.offset, s.length});
      weights.push_back(s.norm_weight);
    }
  }
  return sq_norm_parts(u.grad_shard, runs, weights);
}

void ZeroEngine::post_norm(Unit& u) {
  // Offload all: the host shard's squared norm on the host worker, right after its last add, so
  // the pass over the host gradients overlaps the rest of the backward instead of following it.
  if (!host_sums()) return;
  Unit* unit = &u;
  const ZeroEngine* engine = this;
  u.sq_valid = true;  // read only after a settle(), which waits for the task
  host_->post([engine, unit] { unit->sq_parts = engine->sq_parts(*unit); });
}

at::Tensor ZeroEngine::local_grad_sq_norm() const {
  at::NoGradGuard no_grad;
  settle();
  // Shards on the host (offload all) sum on the host, and their total crosses to the device once.
  // Their pieces were computed by the host worker as each shard became final (post_norm), the
  // same pieces by the same ops as here, summed here in the same order.
  at::Tensor on_device = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(device_));
  at::Tensor on_host;
  for (const auto& u : units_) {
    at::Tensor& total = u->grad_shard.device() == device_ ? on_device : on_host;
    for (const auto& sq : u->sq_valid ? u->sq_parts : sq_parts(*u)) total = total.defined() ? total + sq : sq;
  }
  if (on_host.defined()) on_device = on_device + to_device(on_host, device_);
  return on_device.to(at::kFloat);
}

// ---- the step ------------------------------------------------------------------------------

int64_t ZeroEngine::steps_taken() const {
  return cfg_.offload == Offload::None ? static_cast<int64_t>(to_host(step_t_).item<float>()) : steps_;
}

void ZeroEngine::set_steps_taken(int64_t n) {
  steps_ = n;
  at::NoGradGuard no_grad;
  step_t_.fill_(static_cast<double>(n));
}

void ZeroEngine::finish_update(Unit& u) const {
  if (u.update != 0) {
    host_->wait(u.update);
    u.update = 0;
  }
  if (!delaying_) upload(u);
}

void ZeroEngine::upload(Unit& u) const {
  // Offload optimizer: the updated shard up to the device (16-bit weights: the 2-byte copy the
  // host update wrote); offload all: the host update wrote the host shard the gathers read.
  if (!u.unpublished) return;
  u.unpublished = false;
  at::NoGradGuard no_grad;
  param_shard(u).copy_(u.upload.defined() ? u.upload : u.master, /*non_blocking=*/true);
}

void ZeroEngine::publish_units() {
  // Each unit's update in (and up) as soon as it lands; ZeRO-1/2 then give every rank every
  // rank's updated shard -- in place, each rank's shard is its chunk of flat -- so unit u's
  // all-gather overlaps the host update of u + 1.
  std::vector<std::shared_ptr<Work>> works;
  for (auto& u : units_) {
    finish_update(*u);
    upload(*u);
    if (cfg_.stage == 3 || alone(*u)) continue;
    auto own = u->flat.narrow(0, u->group->rank() * u->shard, u->shard);
    works.push_back(u->group->all_gather(u->flat, own));
  }
  for (auto& w : works) w->wait();
}

void ZeroEngine::publish() {
  if (!cfg_.delayed_update) return;
  // The flags change in step on every rank (every rank posts the same updates), so every rank of
  // a group takes the same decision.
  bool pending = false;
  for (const auto& u : units_) pending = pending || u->unpublished;
  if (!pending) return;
  at::NoGradGuard no_grad;
  settle();
  publish_units();
}

void ZeroEngine::settle() const {
  if (!host_) return;
  for (const auto& u : units_) finish_update(*u);
  host_->drain();
  for (const auto& u : units_) {
    if (!u->fresh) continue;  // no gradient reached it this step: it holds the last step's
    at::NoGradGuard no_grad;
    u->grad_shard.zero_();
    u->fresh = false;
  }
}

void ZeroEngine::post_update(Unit& u, double lr, double factor) {
  // The host shards by raw pointer (the task outlives nothing: the engine drains before it dies).
  float* pm = u.master.data_ptr<float>();
  const float* pg = u.host_grad.data_ptr<float>();
  float* pa = u.exp_avg.data_ptr<float>();
  float* pv = u.exp_avg_sq.data_ptr<float>();
  // The 16-bit working copy, written by the same pass: offload all's host shard, or offload
  // optimizer's upload buffer. fp32 weights: the master is the shard (all) or goes up as it is.
  const at::Tensor out = !sixteen() ? at::Tensor() : cfg_.offload == Offload::All ? u.shard_params : u.upload;
  char* po = out.defined() ? static_cast<char*>(out.data_ptr()) : nullptr;
  const CpuWorking working = !out.defined() ? CpuWorking::none
                             : cfg_.param_dtype == at::kBFloat16 ? CpuWorking::bf16
                                                                 : CpuWorking::fp16;
  std::vector<std::pair<Segment, CpuAdamWStep>> work;
  for (const auto& s : u.segments)
    work.push_back({s, {lr, adam_.beta1, adam_.beta2, adam_.eps, s.decay ? adam_.weight_decay : 0.0, steps_, factor}});
  u.unpublished = cfg_.offload == Offload::Optimizer;
  u.update = host_->post([pm, pg, pa, pv, po, working, work = std::move(work)] {
    for (const auto& [s, st] : work)
      cpu_adamw(pm + s.offset, pg + s.offset, pa + s.offset, pv + s.offset, s.length, st,
                po ? po + s.offset * 2 : nullptr, working);
  });
}

void ZeroEngine::step(double lr, const at::Tensor& grad_factor, const at::Tensor& found_inf) {
  at::NoGradGuard no_grad;
  if (cfg_.offload == Offload::None) {
    // One multi-tensor update per decay group over every unit's segments (kernels/adamw.h): the
    // gradients times grad_factor, AdamW on the fp32 masters, the working shard round16(master).
    AdamWGroup groups[2];
    step_t_.add_(1.0 - found_inf);  // the update reads t already advanced
    for (auto& u : units_) {
      auto ps = u->master.defined() ? u->master : param_shard(*u);  // fp32
      for (const auto& s : u->segments) {
        AdamWGroup& g = groups[s.decay ? 1 : 0];
        g.params.push_back(ps.narrow(0, s.offset, s.length));
        g.grads.push_back(u->grad_shard.narrow(0, s.offset, s.length));
        g.exp_avg.push_back(u->exp_avg.narrow(0, s.offset, s.length));
        g.exp_avg_sq.push_back(u->exp_avg_sq.narrow(0, s.offset, s.length));
        g.steps.push_back(step_t_);
        if (sixteen()) g.working.push_back(param_shard(*u).narrow(0, s.offset, s.length));
      }
    }
    for (int d = 0; d < 2; ++d)
      adamw_update(groups[d], {lr, adam_.beta1, adam_.beta2, d ? adam_.weight_decay : 0.0, adam_.eps}, grad_factor, found_inf,
                   kernels_);
  } else {
    // Offload: the host steps, so it reads the verdict (it waits for the gradients anyway).
    settle();  // every add and download landed (the last step's updates long since)
    // Delayed: the last step's update, run under this step's forward and backward, goes up now
    // (its copies ordered before the synchronize below, which this step's update waits for).
    publish();
    if (to_host(found_inf).item<float>() != 0.0f) {  // skipped: nothing moves
      for (auto& u : units_) u->downloaded = false;
      return;
    }
    const double factor = to_host(grad_factor).item<float>();
    ++steps_;
    step_t_.fill_(static_cast<double>(steps_));
    // Gradient shards down (all issued, then one wait), then one host task per unit, in the
    // order the next forward needs them ("The overlapped host step").
    for (auto& u : units_) {
      if (!u->downloaded && !u->host_grad.is_same(u->grad_shard)) u->host_grad.copy_(u->grad_shard, /*non_blocking=*/true);
      u->downloaded = false;
    }
    synchronize(device_);
    // The delay holds this update back when the updates applied before it reach delay_from.
    delaying_ = cfg_.delayed_update && steps_ - 1 >= cfg_.delay_from;
    for (auto& u : units_) post_update(*u, lr, factor);
  }
  // ZeRO-1/2: every rank's updated shard to every rank (delayed: at the next publish()).
  if (cfg_.stage < 3 && !delaying_) publish_units();
}

void ZeroEngine::begin_forward_only() {
  if (cfg_.stage == 3)
    for (const size_t u : outer_units_) wait_gathered(*units_[u]);
}

void ZeroEngine::end_forward_only() {
  for (auto& u : units_) release(*u);
}

}  // namespace kiln
