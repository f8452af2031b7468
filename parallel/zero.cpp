// parallel/zero.cpp -- units, shards, the gradient hooks, ZeRO-3's gathers; the gradient norm and
// the sharded step are zero_step.cpp's, the whole-parameter views for checkpoints and the reports
// zero_state.cpp's.
#include "parallel/zero.h"

#include <algorithm>
#include <unordered_map>

#include <ATen/ATen.h>
#include <c10/core/StorageImpl.h>

#include "distributed/device.h"
#include "distributed/device_check.h"
#include "distributed/error.h"
#include "distributed/host_memory.h"
#include "kernels/float8.h"
#include "models/gpt.h"
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
  bool float8 = false;  // the block's float8 weights, gathered in 8 bits (ZeroConfig::float8_weight)
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

// The blocks' units (origin >= first_block) with their float8 weights (`float8` picks them) split
// off into a unit right after each (zero.h, "Float8 weights").
std::vector<SplitUnit> split_float8(std::vector<SplitUnit> units, size_t first_block, const std::function<bool(const at::Tensor&)>& float8) {
  std::vector<SplitUnit> out;
  for (auto& u : units) {
    if (u.expert || u.origin < first_block) {
      out.push_back(std::move(u));
      continue;
    }
    std::vector<at::Tensor> rest, weights;
    for (auto& p : u.params) (float8(p) ? weights : rest).push_back(std::move(p));
    if (!rest.empty()) out.push_back({std::move(rest), false, u.origin, false});
    if (!weights.empty()) out.push_back({std::move(weights), false, u.origin, true});
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
  if (cfg_.float8_weight && (cfg_.stage != 3 || cfg_.offload == Offload::All))
    throw ConfigError("zero: the 8-bit weight gather is ZeRO-3's, without --offload all");
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
  std::vector<SplitUnit> split = split_experts(std::move(whole_units), cfg_.is_expert);
  if (cfg_.float8_weight)
    split = split_float8(std::move(split), first_block_unit, [this](const at::Tensor& p) { return cfg_.float8_weight(p) != nullptr; });
  for (auto& [params, expert, origin, float8] : split) {
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
    if (float8) {
      // The layers' q_W: views of the 8-bit flat buffer (each with a version counter of its own:
      // the gathers write the buffer while a backward holds the views), scales of q_scales.
      u->q_flat = at::empty({u->padded}, dev.dtype(at::kByte));
      u->q_shard = at::zeros({u->shard}, dev.dtype(at::kByte));
      u->q_scales = at::ones({static_cast<int64_t>(u->params.size())}, dev);
      for (size_t k = 0; k < u->params.size(); ++k) {
        const auto& p = u->params[k];
        std::shared_ptr<Float8Tensor> slot = cfg_.float8_weight(p);
        slot->data = u->q_flat.narrow(0, u->offsets[k], p.numel()).view(p.sizes()).view(at::kFloat8_e4m3fn).variable_data();
        slot->scale = u->q_scales.select(0, static_cast<int64_t>(k)).variable_data();
        u->slots.push_back(std::move(slot));
      }
      free_storage(u->q_flat);
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
  for (auto& u : units_)  // the layers quantise their weights themselves again
    for (auto& slot : u->slots) *slot = Float8Tensor{};
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
  if (u.float8()) {  // the 8-bit shard's bytes (zero.h, "Float8 weights")
    quantise_shard(u);
    alloc_storage(u.q_flat);
    u.ag_work = u.group->all_gather(u.q_flat, u.q_shard);
    u.state = Unit::State::Gathering;
    return;
  }
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
  free_storage(u.float8() ? u.q_flat : u.flat);
  u.state = Unit::State::Released;
}

void ZeroEngine::quantise_shard(Unit& u) {
  if (u.q_valid) return;
  at::NoGradGuard no_grad;
  const int64_t lo = u.group->rank() * u.shard, hi = lo + u.shard;
  const at::Tensor w = u.shard_params;  // on the device (no offload all), param_dtype
  // Each weight's piece of the shard (empty where the shard holds none of it) and its amax, as
  // to_float8 takes it: |x|'s max in the weight's dtype, then fp32.
  std::vector<std::pair<int64_t, int64_t>> pieces;  // [a, b) of the shard
  std::vector<at::Tensor> amaxes;
  for (size_t k = 0; k < u.params.size(); ++k) {
    const int64_t a = std::max(lo, u.offsets[k]) - lo, b = std::min(hi, u.offsets[k] + u.params[k].numel()) - lo;
    pieces.emplace_back(a, b);
    amaxes.push_back(a < b ? w.narrow(0, a, b - a).abs().max().to(at::kFloat) : at::zeros({}, w.options().dtype(at::kFloat)));
  }
  at::Tensor amax = at::stack(amaxes);
  u.group->all_reduce(amax, ReduceOp::Max)->wait();
  if (cfg_.tp) cfg_.tp->all_reduce(amax, ReduceOp::Max)->wait();  // the weights' other tp parts
  u.q_scales.copy_(amax.clamp_min(1e-12) / 448.0);  // e4m3's largest value (kernels/float8.h)
  const at::Tensor q = u.q_shard.view(at::kFloat8_e4m3fn);
  for (size_t k = 0; k < pieces.size(); ++k) {
    const auto [a, b] = pieces[k];
    if (a < b) q.narrow(0, a, b - a).copy_((w.narrow(0, a, b - a).to(at::kFloat) / u.q_scales[static_cast<int64_t>(k)]).clamp(-448.0, 448.0).to(at::kFloat8_e4m3fn));
  }
  u.q_valid = true;
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

void ZeroEngine::begin_forward_only() {
  if (cfg_.stage == 3)
    for (const size_t u : outer_units_) wait_gathered(*units_[u]);
}

void ZeroEngine::end_forward_only() {
  for (auto& u : units_) release(*u);
}

}  // namespace kiln
