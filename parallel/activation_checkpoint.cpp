// parallel/activation_checkpoint.cpp -- the reentrant checkpoint, gelu_linear, and the modes.
#include "parallel/activation_checkpoint.h"

#include <mutex>
#include <optional>

#include <ATen/ATen.h>
#include <ATen/ExpandUtils.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/ivalue.h>
#include <torch/autograd.h>

#include "distributed/error.h"
#include "kernels/matmul.h"
#include "models/gpt.h"

namespace kiln {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// ---- RNG state -----------------------------------------------------------------------------

at::Tensor generator_state(c10::Device device) {
  at::Generator gen = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_generator_state(c10::Device device, const at::Tensor& state) {
  at::Generator gen = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

// The default CPU generator's state and, when the inputs are on a CUDA device, that device's.
struct RngState {
  at::Tensor cpu;
  std::optional<c10::Device> cuda_device;
  at::Tensor cuda;

  static RngState capture(std::optional<c10::Device> cuda_device) {
    RngState s;
    s.cpu = generator_state(c10::Device(c10::kCPU));
    s.cuda_device = cuda_device;
    if (cuda_device) s.cuda = generator_state(*cuda_device);
    return s;
  }
  void restore() const {
    set_generator_state(c10::Device(c10::kCPU), cpu);
    if (cuda_device) set_generator_state(*cuda_device, cuda);
  }
};

// For its lifetime the generators hold `replay`; afterwards, what they held before (as
// torch.random.fork_rng), so the recomputation leaves the RNG stream where it found it.
class RngReplay {
 public:
  explicit RngReplay(const RngState& replay) : before_(RngState::capture(replay.cuda_device)) { replay.restore(); }
  ~RngReplay() { before_.restore(); }
  RngReplay(const RngReplay&) = delete;
  RngReplay& operator=(const RngReplay&) = delete;

 private:
  RngState before_;
};

// ---- autocast state ------------------------------------------------------------------------

// Autocast on/off and dtype for the CPU and, if the inputs live elsewhere, for their device type.
struct AutocastState {
  bool cpu_enabled = false;
  at::ScalarType cpu_dtype = at::kBFloat16;
  c10::DeviceType device_type = c10::kCPU;  // the inputs' device type
  bool device_enabled = false;
  at::ScalarType device_dtype = at::kHalf;

  static AutocastState capture(c10::DeviceType device_type) {
    AutocastState s;
    s.cpu_enabled = at::autocast::is_autocast_enabled(c10::kCPU);
    s.cpu_dtype = at::autocast::get_autocast_dtype(c10::kCPU);
    if (device_type != c10::kCPU && at::autocast::is_autocast_available(device_type)) {
      s.device_type = device_type;
      s.device_enabled = at::autocast::is_autocast_enabled(device_type);
      s.device_dtype = at::autocast::get_autocast_dtype(device_type);
    }
    return s;
  }
  void set() const {
    at::autocast::set_autocast_enabled(c10::kCPU, cpu_enabled);
    at::autocast::set_autocast_dtype(c10::kCPU, cpu_dtype);
    if (device_type != c10::kCPU) {
      at::autocast::set_autocast_enabled(device_type, device_enabled);
      at::autocast::set_autocast_dtype(device_type, device_dtype);
    }
  }
};

// Switches the autocast cast cache off for its lifetime (see the header: a weight cast cached
// under no-grad without a grad_fn, as LibTorch before the #158232 fix did, must not be found
// again by the recomputation).
class NoCastCache {
 public:
  NoCastCache() : before_(at::autocast::is_autocast_cache_enabled()) { at::autocast::set_autocast_cache_enabled(false); }
  ~NoCastCache() { at::autocast::set_autocast_cache_enabled(before_); }
  NoCastCache(const NoCastCache&) = delete;
  NoCastCache& operator=(const NoCastCache&) = delete;

 private:
  bool before_;
};

// For its lifetime autocast is as `state` says (the forward's; backward runs outside autocast),
// without the cast cache; afterwards, as before.
class AutocastReplay {
 public:
  explicit AutocastReplay(const AutocastState& state) : before_(AutocastState::capture(state.device_type)) { state.set(); }
  ~AutocastReplay() { before_.set(); }
  AutocastReplay(const AutocastReplay&) = delete;
  AutocastReplay& operator=(const AutocastReplay&) = delete;

 private:
  AutocastState before_;
  NoCastCache no_cache_;
};

// ---- the checkpoint function ---------------------------------------------------------------

// What backward needs besides the saved inputs. A std::function cannot live in
// ctx->saved_data (IValues only), so it travels in a capsule.
struct CheckpointState : torch::CustomClassHolder {
  CheckpointFn fn;
  CheckpointOptions opts;
  std::vector<bool> requires_grad;  // per input, at forward time
  std::optional<RngState> rng;      // when opts.preserve_rng_state
  AutocastState autocast;
};

struct CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
  // Runs with grad mode off (Function::apply). `state` is not a tensor: backward returns an
  // undefined gradient for it, then one per input.
  static variable_list forward(AutogradContext* ctx, c10::intrusive_ptr<CheckpointState> state,
                               at::TensorList inputs) {
    std::optional<c10::Device> cuda;
    for (const auto& x : inputs) {
      state->requires_grad.push_back(x.defined() && x.requires_grad());
      if (x.defined() && x.is_cuda() && !cuda) cuda = x.device();
    }
    const c10::DeviceType device_type =
        cuda ? c10::kCUDA : (inputs.empty() || !inputs[0].defined() ? c10::kCPU : inputs[0].device().type());
    state->autocast = AutocastState::capture(device_type);
    if (state->opts.preserve_rng_state) state->rng = RngState::capture(cuda);
    variable_list outputs;
    {
      NoCastCache no_cache;
      outputs = state->fn(inputs.vec());
    }
    ctx->save_for_backward(inputs.vec());
    ctx->saved_data["state"] = at::IValue::make_capsule(std::move(state));
    return outputs;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto capsule = ctx->saved_data["state"].toCapsule();  // keeps the state alive here
    const auto* state = static_cast<const CheckpointState*>(capsule.get());
    const variable_list saved = ctx->get_saved_variables();
    variable_list inputs;
    inputs.reserve(saved.size());
    for (size_t i = 0; i < saved.size(); ++i) {
      if (!saved[i].defined()) {
        inputs.push_back(saved[i]);
        continue;
      }
      auto x = saved[i].detach();
      x.requires_grad_(state->requires_grad[i]);
      inputs.push_back(std::move(x));
    }
    // Recompute with the forward's RNG and autocast state, grad on.
    variable_list outputs;
    {
      std::optional<RngReplay> rng;
      if (state->rng) rng.emplace(*state->rng);
      AutocastReplay autocast(state->autocast);
      at::AutoGradMode grad_on(true);
      outputs = state->fn(inputs);
    }
    TORCH_CHECK(outputs.size() == grad_outputs.size(), "checkpoint: the recomputation returned ", outputs.size(),
                " outputs, the forward ", grad_outputs.size());
    variable_list roots, grads;
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (outputs[i].requires_grad() && grad_outputs[i].defined()) {
        roots.push_back(outputs[i]);
        grads.push_back(grad_outputs[i]);
      }
    }
    // Reentrant backward: parameter gradients land in .grad through their AccumulateGrad nodes.
    if (!roots.empty()) torch::autograd::backward(roots, grads);
    variable_list result{at::Tensor()};  // for `state`
    for (const auto& x : inputs) result.push_back(x.defined() && x.requires_grad() ? x.grad() : at::Tensor());
    return result;
  }
};

// ---- gelu_linear ---------------------------------------------------------------------------

struct AutocastHolder : torch::CustomClassHolder {
  explicit AutocastHolder(AutocastState s) : state(s) {}
  AutocastState state;
};

struct GeluLinearFunction : public torch::autograd::Function<GeluLinearFunction> {
  // The bias is optional (a model without biases, --bias none): autograd's custom functions take an
  // absent tensor input as std::optional, an undefined at::Tensor not at all.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& h, const at::Tensor& weight,
                            const std::optional<at::Tensor>& bias) {
    const auto autocast = AutocastState::capture(h.device().type());
    at::Tensor y;
    {
      NoCastCache no_cache;
      y = linear_product(at::gelu(h, "tanh"), weight, bias.value_or(at::Tensor()));  // autocast, if on, casts as usual
    }
    ctx->save_for_backward({h, weight});
    ctx->saved_data["autocast"] = at::IValue::make_capsule(c10::make_intrusive<AutocastHolder>(autocast));
    ctx->saved_data["compute_dtype"] = static_cast<int64_t>(y.scalar_type());  // the GEMM's dtype
    ctx->saved_data["has_bias"] = bias.has_value() && bias->defined();
    return y;
  }

  // Mirrors autograd's backward of at::linear (addmm on [M, K] x [K, N]) and of autocast's
  // casts (ToCopyBackward): dg = dy.mm(W), dW = dy^T.mm(g), db = sum_to(dy, [N]); each grad is
  // computed in the GEMM's dtype and the engine casts it back to its input's dtype.
  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& h = saved[0];
    const at::Tensor& weight = saved[1];
    const auto ct = static_cast<at::ScalarType>(ctx->saved_data["compute_dtype"].toInt());
    const auto capsule = ctx->saved_data["autocast"].toCapsule();
    const AutocastState autocast = static_cast<const AutocastHolder*>(capsule.get())->state;
    at::Tensor g;
    {
      AutocastReplay replay(autocast);  // gelu(h) exactly as in the forward
      g = at::gelu(h, "tanh");
    }
    const int64_t N = weight.size(0), K = weight.size(1);
    const at::Tensor dy = grad_outputs[0].reshape({-1, N});
    at::Tensor dh, dw, db;
    if (ctx->needs_input_grad(0)) {
      auto dg = matmul_product(dy, weight.to(ct)).view(h.sizes()).to(g.scalar_type());
      dh = at::gelu_backward(dg, h, "tanh");
    }
    if (ctx->needs_input_grad(1)) dw = matmul_product(dy.t(), g.reshape({-1, K}).to(ct));
    if (ctx->saved_data["has_bias"].toBool() && ctx->needs_input_grad(2)) db = at::sum_to(dy, weight.sizes().slice(0, 1));  // [N]
    return {dh, dw, db};
  }
};

}  // namespace

// ---- public API ----------------------------------------------------------------------------

std::vector<at::Tensor> checkpoint(CheckpointFn fn, const std::vector<at::Tensor>& inputs, CheckpointOptions opts) {
  bool any_requires_grad = false;
  for (const auto& x : inputs) any_requires_grad = any_requires_grad || (x.defined() && x.requires_grad());
  // No graph would be built (eval, no-grad), or no gradient can flow back through the inputs
  // (then parameters inside fn would get none through a checkpoint): run fn plainly.
  if (!at::GradMode::is_enabled() || !any_requires_grad) return fn(inputs);
  auto state = c10::make_intrusive<CheckpointState>();
  state->fn = std::move(fn);
  state->opts = opts;
  return CheckpointFunction::apply(std::move(state), at::TensorList(inputs));
}

at::Tensor checkpoint(std::function<at::Tensor(const at::Tensor&)> fn, const at::Tensor& input, CheckpointOptions opts) {
  CheckpointFn wrapped = [fn = std::move(fn)](const std::vector<at::Tensor>& in) {
    return std::vector<at::Tensor>{fn(in[0])};
  };
  return checkpoint(std::move(wrapped), std::vector<at::Tensor>{input}, opts)[0];
}

at::Tensor gelu_linear(const at::Tensor& h, const at::Tensor& weight, const at::Tensor& bias) {
  return GeluLinearFunction::apply(h, weight, bias.defined() ? std::optional<at::Tensor>(bias) : std::nullopt);
}

ActivationCheckpointing parse_activation_checkpointing(const std::string& name) {
  if (name == "none") return ActivationCheckpointing::None;
  if (name == "full") return ActivationCheckpointing::Full;
  if (name == "selective") return ActivationCheckpointing::Selective;
  throw ConfigError("--activation-checkpointing '" + name + "' is not one of none, full, selective");
}

std::string to_string(ActivationCheckpointing mode) {
  switch (mode) {
    case ActivationCheckpointing::None: return "none";
    case ActivationCheckpointing::Full: return "full";
    case ActivationCheckpointing::Selective: return "selective";
  }
  return "unknown";
}

void apply_activation_checkpointing(GPT& model, ActivationCheckpointing mode, CheckpointOptions opts) {
  model.block_runner = nullptr;
  for (const auto& b : model.blocks()) {
    auto& block = *b;
    block.attn->core = nullptr;
    if (block.mlp) block.mlp->gelu_proj = nullptr;
  }
  switch (mode) {
    case ActivationCheckpointing::None:
      break;
    case ActivationCheckpointing::Full:
      model.block_runner = [opts](BlockImpl& block, const at::Tensor& x) {
        // The graph keeps the block alive for as long as it may recompute it.
        auto self = std::static_pointer_cast<BlockImpl>(block.shared_from_this());
        // --document-mask: the recomputation sees the mask (the documents) the forward saw (under a
        // pipeline schedule later micro-batches' forwards come between), then puts back what it found.
        return checkpoint(
            [self, mask = self->attn->mask](const at::Tensor& in) {
              auto now = self->attn->mask;
              self->attn->mask = mask;
              at::Tensor y;
              try {
                y = self->forward(in);
              } catch (...) {
                self->attn->mask = now;
                throw;
              }
              self->attn->mask = now;
              return y;
            },
            x, opts);
      };
      break;
    case ActivationCheckpointing::Selective:
      for (const auto& b : model.blocks()) {
        auto& block = *b;
        block.attn->core = [opts](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double p,
                                  const at::Tensor& mask) {
          CheckpointFn core = [p, mask](const std::vector<at::Tensor>& in) {
            return std::vector<at::Tensor>{causal_attention(in[0], in[1], in[2], p, mask)};
          };
          return checkpoint(std::move(core), {q, k, v}, opts)[0];
        };
        // An MoE block keeps its experts' activations (models/moe.h); a SwiGLU feed-forward keeps
        // its gate and up products (its silu(gate) * up is not recomputed: not built).
        if (block.mlp && !block.mlp->swiglu()) {
          block.mlp->gelu_proj = [](const at::Tensor& h, const at::Tensor& weight, const at::Tensor& bias) {
            return gelu_linear(h, weight, bias);
          };
        }
      }
      break;
  }
}

}  // namespace kiln
