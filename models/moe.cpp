// models/moe.cpp -- the router, the capacity rule, the sorted dispatch, the experts, the two losses.
#include "models/moe.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/autograd.h>

#include "distributed/device_check.h"
#include "kernels/matmul.h"
#include "kernels/swiglu.h"
#include "distributed/error.h"
#include "models/gpt.h"
#include "models/gpt_config.h"

namespace kiln {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// y unchanged; backward gives `loss` the gradient `scale` besides passing y's on (Megatron's
// MoEAuxLossAutoScaler): the auxiliary losses join the gradient wherever the block's backward
// runs (a pipeline stage, a checkpointed block's recomputation), without joining the LM loss.
struct AttachAuxLoss : public torch::autograd::Function<AttachAuxLoss> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& y, const at::Tensor& loss, double scale) {
    ctx->saved_data["scale"] = scale;
    ctx->save_for_backward({loss});
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor loss = ctx->get_saved_variables()[0];
    return {grads[0], at::full({}, ctx->saved_data["scale"].toDouble(), loss.options()), at::Tensor()};
  }
};

}  // namespace

void MoEConfig::validate() const {
  if (n_experts < 1) throw ConfigError("--n-experts must be at least 1 (got " + std::to_string(n_experts) + ")");
  if (top_k < 1 || top_k > n_experts) {
    throw ConfigError("--top-k must be in [1, --n-experts " + std::to_string(n_experts) + "] (got " + std::to_string(top_k) + ")");
  }
  if (!(capacity_factor >= 0.0)) throw ConfigError("--moe-capacity-factor must be 0 (dropless) or positive");
  if (!(aux_loss_coef >= 0.0)) throw ConfigError("--moe-aux-loss-coef must be at least 0");
  if (!(z_loss_coef >= 0.0)) throw ConfigError("--moe-z-loss-coef must be at least 0");
}

MoEConfig MoEConfig::of(const GPTConfig& c) {
  MoEConfig m;
  m.n_experts = c.n_experts;
  m.top_k = c.top_k;
  m.capacity_factor = c.moe_capacity_factor;
  m.aux_loss_coef = c.moe_aux_loss_coef;
  m.z_loss_coef = c.moe_z_loss_coef;
  m.swiglu = c.swiglu();
  m.bias = c.linear_bias();
  return m;
}

int64_t moe_capacity(const MoEConfig& cfg, int64_t n_tokens) {
  if (cfg.capacity_factor <= 0.0) return 0;
  return static_cast<int64_t>(std::ceil(cfg.capacity_factor * static_cast<double>(cfg.top_k * n_tokens) /
                                        static_cast<double>(cfg.n_experts)));
}

MoEImpl::MoEImpl(int64_t d, int64_t hidden, const MoEConfig& cfg, const at::TensorOptions& opts, std::shared_ptr<const LayerOps> ops)
    : cfg_(cfg), ops_(std::move(ops)) {
  cfg_.validate();
  const int64_t E = cfg_.n_experts, split = ops_ ? ops_->expert_split : 1;
  if (E % split != 0) {
    throw ConfigError("--ep " + std::to_string(split) + " does not divide the experts (--n-experts " + std::to_string(E) + ")");
  }
  const int64_t local = E / split;
  router = register_parameter("router", at::empty({E, d}, opts));
  const int64_t fc = cfg_.swiglu ? 2 * hidden : hidden;  // SwiGLU: gate's rows, then up's
  fc_w = register_parameter("fc_w", at::empty({local, fc, d}, opts));
  if (cfg_.bias) fc_b = register_parameter("fc_b", at::empty({local, fc}, opts));
  proj_w = register_parameter("proj_w", at::empty({local, d, hidden}, opts));
  if (cfg_.bias) proj_b = register_parameter("proj_b", at::empty({local, d}, opts));
}

at::Tensor MoEImpl::run_experts(const at::Tensor& rows, const std::vector<int64_t>& counts) const {
  // One unbind per weight, not E selects: each select's backward would make a whole [E, ...]
  // gradient (E^2 the traffic); unbind's stacks the experts' gradients once.
  const std::vector<at::Tensor> fw = fc_w.unbind(0), pw = proj_w.unbind(0);
  const std::vector<at::Tensor> fb = fc_b.defined() ? fc_b.unbind(0) : std::vector<at::Tensor>(fw.size());
  const std::vector<at::Tensor> pb = proj_b.defined() ? proj_b.unbind(0) : std::vector<at::Tensor>(pw.size());
  auto expert = [&](size_t e, const at::Tensor& r) {
    const at::Tensor u = linear_product(r, fw[e], fb[e], &float8);
    if (!cfg_.swiglu) return linear_product(at::gelu(u, "tanh"), pw[e], pb[e], &float8);
    return linear_product(swiglu(u, kernels), pw[e], pb[e], &float8);
  };
  std::vector<at::Tensor> outs;
  int64_t offset = 0;
  for (size_t e = 0; e < counts.size(); ++e) {
    if (counts[e] == 0) continue;
    outs.push_back(expert(e, rows.narrow(0, offset, counts[e])));
    offset += counts[e];
  }
  if (offset != rows.size(0)) throw Error("MoE: the expert counts do not add up to the rows given");
  // No rows for any local expert: still an output in the autograd graph (zero rows through the
  // first expert), so that under ep the combine's and the dispatch's backward all-to-alls run on
  // this rank too. A tensor outside the graph left it out of them, and its peers hung.
  if (outs.empty()) return expert(0, rows.narrow(0, 0, 0));
  return at::cat(outs);
}

at::Tensor MoEImpl::forward(const at::Tensor& x_in) {
  if (x_in.dim() != 2 && x_in.dim() != 3) throw Error("MoE: input must be [N, d] or [G, S, d]");
  const int64_t d = x_in.size(-1), E = cfg_.n_experts, k = cfg_.top_k;
  const at::Tensor x = x_in.reshape({-1, d});
  const int64_t N = x.size(0);
  const int64_t G = x_in.dim() == 3 ? x_in.size(0) : 1, S = G > 0 ? N / G : 0;
  // Router in fp32 at least (its softmax decides discrete choices; ST-MoE keeps it in fp32 too),
  // autocast or not.
  const auto rdt = at::promote_types(at::kFloat, x.scalar_type());
  at::Tensor logits;  // [N, E]
  {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    logits = at::linear(x.to(rdt), router.to(rdt));
  }
  const at::Tensor probs = at::softmax(logits, -1);
  auto [top_p, top_e] = at::topk(probs, k, -1);  // [N, k], descending
  const at::Tensor gates = k > 1 ? top_p / top_p.sum(-1, /*keepdim=*/true) : top_p;

  // A split sequence (--sp, --cp: LayerOps::gather_sequence): this rank holds S of the sequence's
  // S_w positions. Its ranks gather the sequence's choices (k int64 a token) and each decides
  // the whole group's admissions as the unsplit layer does, keeping its own rows' (seq_rows).
  const bool split = ops_ && ops_->gather_sequence && x_in.dim() == 3;
  const at::Tensor whole_e = split ? ops_->gather_sequence(top_e.view({G, S, k})) : top_e.view({G, S, k});  // [G, S_w, k]
  const int64_t S_w = whole_e.size(1);

  // Capacity, per group: choice j of every token before choice j + 1 of any; token order within
  // a choice. position: the assignment's slot within its expert's queue.
  const int64_t C = moe_capacity(cfg_, S_w);
  at::Tensor admitted;  // [N, k]
  if (C > 0) {
    const at::Tensor order = whole_e.transpose(1, 2).reshape({G, k * S_w});  // choice-major
    const at::Tensor onehot = at::one_hot(order, E);                         // [G, k S_w, E]
    const at::Tensor position = (onehot.cumsum(1) - 1).mul_(onehot).sum(-1);  // [G, k S_w]
    at::Tensor whole = position.lt(C).view({G, k, S_w}).transpose(1, 2);      // [G, S_w, k]
    if (split) whole = whole.index_select(1, ops_->seq_rows(S_w, x.device()));
    admitted = whole.reshape({N, k});
  } else {
    admitted = at::ones({N, k}, top_e.options().dtype(at::kBool));
  }

  // Dispatch: the assignments (token-major: n k + j) sorted by expert, the dropped ones last (as
  // expert E); a stable sort keeps token order within an expert.
  const at::Tensor chosen = top_e.reshape({-1});
  const at::Tensor key = chosen.masked_fill(admitted.reshape({-1}).logical_not(), E);
  const at::Tensor perm = std::get<1>(at::sort(key, /*stable=*/true, /*dim=*/0, /*descending=*/false));
  const at::Tensor ones = at::ones_like(key);
  const at::Tensor kept = at::zeros({E + 1}, key.options()).index_add_(0, key, ones).narrow(0, 0, E);
  const at::Tensor routed = at::zeros({E}, key.options()).index_add_(0, chosen, ones);  // before dropping
  // Expert parallelism: the counts exchanged on the device first, so this one read takes both.
  const bool ep = ops_ && ops_->dispatch_experts;
  const at::Tensor arriving = ep ? ops_->exchange_counts(kept) : at::Tensor();
  const at::Tensor host = to_host(ep ? at::cat({kept, routed, arriving}) : at::cat({kept, routed}));  // the call's one host read
  const int64_t* h = host.data_ptr<int64_t>();
  const std::vector<int64_t> counts(h, h + E);
  const std::vector<int64_t> arrived_counts = ep ? std::vector<int64_t>(h + 2 * E, h + host.numel()) : std::vector<int64_t>{};
  int64_t n_kept = 0, most = 0, least = N * k;
  for (int64_t e = 0; e < E; ++e) {
    n_kept += h[e];
    most = std::max(most, h[E + e]);
    least = std::min(least, h[E + e]);
  }
  const at::Tensor take = perm.narrow(0, 0, n_kept);           // admitted assignments, by expert
  const at::Tensor tokens = at::div(take, k, "floor");         // their tokens
  const at::Tensor g = gates.reshape({-1}).index_select(0, take).unsqueeze(-1);  // [n_kept, 1]
  // Under autocast the experts' products run in its dtype: the rows are cast to it here, once,
  // before they travel (on CUDA ln_2's output is fp32: half the all-to-all's bytes, and the same
  // products, which autocast would cast anyway).
  at::Tensor rows = x.index_select(0, tokens);
  const auto dev = rows.device().type();
  if (at::autocast::is_autocast_enabled(dev)) rows = rows.to(at::autocast::get_autocast_dtype(dev));
  const at::Tensor out = ep ? ops_->dispatch_experts(rows, counts, arrived_counts, arriving,
                                                    [this](const at::Tensor& r, const std::vector<int64_t>& c) { return run_experts(r, c); })
                           : run_experts(rows, counts);
  at::Tensor y = at::zeros({N, d}, x.options()).index_add_(0, tokens, (out * g.to(out.scalar_type())).to(x.scalar_type()));

  // Losses: Switch's load balancing per group (f from the choices before dropping, P
  // differentiable) and the router z-loss. Under a split sequence this rank's parts: f is the
  // whole sequence's, P and the z-loss's mean sum this rank's tokens over the whole count, so the
  // parts add up to the unsplit losses over the sequence's ranks (the step record's sum), and
  // their gradients are the unsplit ones' at this rank's tokens (scaled below for cp's mean).
  const double whole_tokens = static_cast<double>(G * S_w);
  const at::Tensor f = at::one_hot(whole_e.reshape({G, S_w * k}), E).to(rdt).mean(1);  // [G, E], rows sum to 1
  const at::Tensor P = probs.view({G, S, E}).sum(1) / static_cast<double>(S_w);        // [G, E]
  aux_loss = (static_cast<double>(E) * (f * P).sum(-1)).mean();
  z_loss = at::logsumexp(logits, -1).square().sum() / std::max(whole_tokens, 1.0);

  const double mean_load = static_cast<double>(N * k) / static_cast<double>(E);
  stats.dropped_fraction = N * k > 0 ? 1.0 - static_cast<double>(n_kept) / static_cast<double>(N * k) : 0.0;
  stats.max_load = mean_load > 0 ? static_cast<double>(most) / mean_load : 0.0;
  stats.min_load = mean_load > 0 ? static_cast<double>(least) / mean_load : 0.0;

  at::Tensor result = y.view(x_in.sizes());
  if (at::GradMode::is_enabled()) {
    const auto fo = routed.options().dtype(at::kFloat);
    const at::Tensor row = at::cat({routed.to(at::kFloat), at::full({1}, static_cast<double>(n_kept), fo),
                                    aux_loss.detach().to(at::kFloat).reshape({1}), z_loss.detach().to(at::kFloat).reshape({1})});
    step_stats = step_stats.defined() ? step_stats + row : row;
    const double ca = cfg_.aux_loss_coef, cz = cfg_.z_loss_coef;
    if ((ca > 0.0 || cz > 0.0) && router.requires_grad()) {
      const double factor = split ? ops_->sequence_loss_factor : 1.0;
      result = AttachAuxLoss::apply(result, (ca * aux_loss + cz * z_loss) * factor, loss_backward_scale);
    }
  }
  return result;
}

}  // namespace kiln
