// parallel/tensor_parallel.cpp -- the autograd functions and the layers.
#include "parallel/tensor_parallel.h"

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <torch/autograd.h>

#include <algorithm>
#include <limits>
#include <mutex>
#include <optional>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>

#include "distributed/error.h"
#include "kernels/classifier.h"
#include "kernels/matmul.h"
#include "models/gpt.h"
#include "optim/adamw.h"
#include "optim/grad_clip.h"
#include "parallel/group_capsule.h"
#include "parallel/sequence_parallel.h"

namespace kiln {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::IValue capsule(const std::shared_ptr<Communicator>& tp) { return group_capsule(tp); }
Communicator& group_of(AutogradContext* ctx) { return group_in(ctx->saved_data["tp"]); }

// A summed copy of t over the group (t itself is left alone).
at::Tensor all_reduced(const at::Tensor& t, Communicator& tp, ReduceOp op = ReduceOp::Sum) {
  at::Tensor out = t.contiguous().clone();
  tp.all_reduce(out, op)->wait();
  return out;
}

struct CopyToTp : public torch::autograd::Function<CopyToTp> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, at::IValue tp) {
    ctx->saved_data["tp"] = std::move(tp);
    return x;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {all_reduced(grads[0], group_of(ctx)), at::Tensor()};
  }
};

struct ReduceFromTp : public torch::autograd::Function<ReduceFromTp> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, at::IValue tp) {
    ctx->saved_data["tp"] = tp;
    return all_reduced(x, group_in(tp));
  }
  static variable_list backward(AutogradContext* /*ctx*/, variable_list grads) { return {grads[0], at::Tensor()}; }
};

// Forward: identity on this rank's piece of a kv head that several tp ranks hold (tp > kv
// heads). Backward: the gradient summed over the ranks holding the same head -- through one
// all-reduce over tp of a [KV, ...] buffer where each rank fills its head's slot.
struct SumOverKvSharers : public torch::autograd::Function<SumOverKvSharers> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& w, int64_t head, int64_t kv_heads, at::IValue tp) {
    ctx->saved_data["tp"] = std::move(tp);
    ctx->saved_data["head"] = head;
    ctx->saved_data["kv"] = kv_heads;
    return w;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const int64_t head = ctx->saved_data["head"].toInt(), kv = ctx->saved_data["kv"].toInt();
    const at::Tensor& g = grads[0];
    std::vector<int64_t> shape{kv};
    for (auto s : g.sizes()) shape.push_back(s);
    at::Tensor slots = at::zeros(shape, g.options());
    slots[head].copy_(g);
    group_of(ctx).all_reduce(slots, ReduceOp::Sum)->wait();
    return {slots[head], at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// Cross-entropy over vocabulary-split logits (the header has the math).
struct VocabParallelCrossEntropy : public torch::autograd::Function<VocabParallelCrossEntropy> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits, const at::Tensor& targets,
                            int64_t vocab_start, int64_t vocab, at::IValue tp_capsule) {
    auto& tp = group_in(tp_capsule);
    const int64_t rows = logits.size(1);
    at::Tensor z = logits.to(at::kFloat);
    if (vocab_start + rows > vocab) {  // padding columns: out of the softmax
      const int64_t keep = std::max<int64_t>(0, vocab - vocab_start);
      z = z.clone();
      z.narrow(1, keep, rows - keep).fill_(-std::numeric_limits<float>::infinity());
    }
    const at::Tensor m = all_reduced(std::get<0>(z.max(1)), tp, ReduceOp::Max);
    const at::Tensor shifted = z - m.unsqueeze(1);
    at::Tensor local = targets - vocab_start;
    const at::Tensor outside = local.lt(0).logical_or(local.ge(rows));
    local = local.masked_fill(outside, 0);
    const at::Tensor target_logit = shifted.gather(1, local.unsqueeze(1)).squeeze(1).masked_fill(outside, 0.0);
    const at::Tensor e = shifted.exp();
    // The target logits and the sums of exponentials in one all-reduce.
    const at::Tensor both = all_reduced(at::stack({target_logit, e.sum(1)}), tp);
    const at::Tensor sum_exp = both[1];
    const at::Tensor loss = (sum_exp.log() - both[0]).mean();
    ctx->save_for_backward({e / sum_exp.unsqueeze(1), local, outside});
    ctx->saved_data["dtype"] = static_cast<int64_t>(logits.scalar_type());
    return loss;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& softmax = saved[0];
    const at::Tensor& local = saved[1];
    const at::Tensor& outside = saved[2];
    const int64_t n = softmax.size(0);
    // d loss / d z = (softmax - onehot(target)) / N, the one-hot only where this rank holds it.
    at::Tensor onehot = at::zeros_like(softmax).scatter_(1, local.unsqueeze(1), 1.0);
    onehot.masked_fill_(outside.unsqueeze(1), 0.0);
    at::Tensor dz = (softmax - onehot) * (grads[0] / static_cast<double>(n));
    return {dz.to(static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt())), at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor()};
  }
};

// The two-pass way (the header's second form): the local passes are kernels/classifier.h's.
struct VocabParallelCrossEntropyTwoPass : public torch::autograd::Function<VocabParallelCrossEntropyTwoPass> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits, const at::Tensor& targets,
                            int64_t vocab_start, int64_t vocab, at::IValue tp_capsule, int64_t kernels) {
    auto& tp = group_in(tp_capsule);
    const Kernels k = static_cast<Kernels>(kernels);
    const at::Tensor z = logits.contiguous();
    const int64_t cols = std::clamp<int64_t>(vocab - vocab_start, 0, z.size(1));
    const auto [m, s] = softmax_row_stats(z, cols, k);
    const at::Tensor M = all_reduced(m, tp, ReduceOp::Max);
    at::Tensor local = targets - vocab_start;
    const at::Tensor outside = local.lt(0).logical_or(local.ge(cols));
    local = local.masked_fill(outside, -1);
    const at::Tensor zt = z.gather(1, local.clamp_min(0).unsqueeze(1)).squeeze(1).to(at::kFloat).masked_fill(outside, 0.0);
    // The target logits and the sums rescaled to the common maximum in one all-reduce.
    const at::Tensor both = all_reduced(at::stack({zt, s * (m - M).exp()}), tp);
    const at::Tensor lse = M + both[1].log();
    ctx->save_for_backward({z, lse, local});
    ctx->saved_data["cols"] = cols;
    ctx->saved_data["kernels"] = kernels;
    return (lse - both[0]).mean();
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &z = saved[0], &lse = saved[1], &local = saved[2];
    const at::Tensor scale = (grads[0] / static_cast<double>(z.size(0))).to(at::kFloat);
    at::Tensor dz = softmax_xent_grad(z, ctx->saved_data["cols"].toInt(), lse, local, scale,
                                      static_cast<Kernels>(ctx->saved_data["kernels"].toInt()));
    return {dz, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor copy_to_tp(const at::Tensor& x, const std::shared_ptr<Communicator>& tp) {
  return CopyToTp::apply(x, capsule(tp));
}

at::Tensor reduce_from_tp(const at::Tensor& x, const std::shared_ptr<Communicator>& tp) {
  return ReduceFromTp::apply(x, capsule(tp));
}

at::Tensor column_parallel_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                                  const std::shared_ptr<Communicator>& tp, const Float8Scaling* float8) {
  return linear_product(copy_to_tp(x, tp), weight, bias, float8);
}

at::Tensor row_parallel_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                               const std::shared_ptr<Communicator>& tp) {
  at::Tensor y = reduce_from_tp(linear_product(x, weight), tp);
  return bias.defined() ? y + bias : y;
}

namespace {
// A float8 layer's scaling under tp (kernels/float8.h): an amax over a dim tp splits is the
// group's maximum. Column-split layers split the output features n (W's rows, the output
// gradient's columns), their input whole; row-split layers split the input features k (W's and
// the input's columns), their output (so its gradient) whole. Null where the layer is not float8;
// `out` holds the scaling.
const Float8Scaling* tp_float8(const LinearImpl& l, const std::shared_ptr<Communicator>& tp, bool column, Float8Scaling& out) {
  if (!l.float8.on) return nullptr;
  out = l.float8;
  if (!l.is_training()) out.cache = nullptr;  // the weight cache serves training-mode forwards (LinearImpl::float8)
  AmaxReduce& split = column ? out.n : out.k;
  split = amax_over(tp, split);  // after any reduction the layer already has over that dim
  return &out;
}

// This rank's part of the embedding: ids outside its vocabulary rows look up zero.
at::Tensor partial_embedding(const at::Tensor& ids, const at::Tensor& table, int64_t vocab_start) {
  at::Tensor local = ids - vocab_start;
  const at::Tensor outside = local.lt(0).logical_or(local.ge(table.size(0)));
  local = local.masked_fill(outside, 0);
  return at::embedding(table, local).masked_fill(outside.unsqueeze(-1), 0.0);
}
}  // namespace

at::Tensor vocab_parallel_embedding(const at::Tensor& ids, const at::Tensor& table, int64_t vocab_start,
                                    const std::shared_ptr<Communicator>& tp) {
  return reduce_from_tp(partial_embedding(ids, table, vocab_start), tp);
}

at::Tensor vocab_parallel_cross_entropy(const at::Tensor& logits, const at::Tensor& targets, int64_t vocab_start,
                                        int64_t vocab, const std::shared_ptr<Communicator>& tp, bool two_pass, Kernels kernels) {
  if (two_pass) {
    return VocabParallelCrossEntropyTwoPass::apply(logits, targets, vocab_start, vocab, capsule(tp),
                                                   static_cast<int64_t>(kernels));
  }
  return VocabParallelCrossEntropy::apply(logits, targets, vocab_start, vocab, capsule(tp));
}

// ---- the model ---------------------------------------------------------------------------

namespace {
// Whether tp ranks can split the model (the rules below), without a message.
bool tp_fits(const GPTConfig& cfg, int64_t tp) {
  return cfg.n_head % tp == 0 && (cfg.n_kv_head % tp == 0 || tp % cfg.n_kv_head == 0) && cfg.d_model % tp == 0 &&
         cfg.mlp_hidden() % tp == 0 && cfg.padded_vocab_size() % tp == 0;
}
}  // namespace

void check_tensor_parallel(const GPTConfig& cfg, int64_t tp) {
  if (tp_fits(cfg, tp)) return;
  // The sizes that would work, for the message (every split layer divides by them).
  std::string fits;
  for (int64_t t = 1; t <= cfg.n_head; ++t)
    if (tp_fits(cfg, t)) fits += (fits.empty() ? "" : ", ") + std::to_string(t);
  const std::string hint = "; --tp values this model splits into: " + fits;
  auto need = [&](int64_t n, const char* what) {
    if (n % tp != 0) {
      throw ConfigError("--tp " + std::to_string(tp) + " does not divide " + what + " (" + std::to_string(n) + ")" + hint);
    }
  };
  need(cfg.n_head, "the attention heads (--n-head)");
  // kv heads: divided over tp when tp divides them, replicated (each rank keeps the one its query
  // heads use) when they divide tp.
  if (cfg.n_kv_head % tp != 0 && tp % cfg.n_kv_head != 0) {
    throw ConfigError("--tp " + std::to_string(tp) + " and the key/value heads (--n-kv-head " +
                      std::to_string(cfg.n_kv_head) + ") must divide one another" + hint);
  }
  need(cfg.d_model, "--d-model");
  need(cfg.mlp_hidden(), "the feed-forward width (4 d_model, or --ffn-hidden)");
  need(cfg.padded_vocab_size(), "the padded vocabulary");
}

at::Tensor with_rank_rng(c10::Device device, int64_t rank, const std::function<at::Tensor()>& fn) {
  at::Generator gen = device.is_cuda() ? at::globalContext().defaultGenerator(device) : at::detail::getDefaultCPUGenerator();
  at::Tensor saved;
  {
    std::lock_guard<std::mutex> lock(gen.mutex());
    saved = gen.get_state();
    const auto* bytes = saved.data_ptr<uint8_t>();
    uint64_t h = 1469598103934665603ull;  // FNV-1a of the state, then the rank mixed in
    for (int64_t i = 0; i < saved.numel(); ++i) h = (h ^ bytes[i]) * 1099511628211ull;
    h ^= (static_cast<uint64_t>(rank) + 1) * 0x9E3779B97F4A7C15ull;
    gen.set_current_seed(h >> 1);
  }
  at::Tensor out;
  try {
    out = fn();
  } catch (...) {
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(saved);
    throw;
  }
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(saved);
  return out;
}

ModelShard make_tensor_parallel_shard(const GPTConfig& cfg, const std::shared_ptr<Communicator>& tp, bool sequence_parallel) {
  check_tensor_parallel(cfg, tp->size());
  ModelShard shard;
  shard.tp = tp->size();
  shard.rank = tp->rank();
  const int64_t t = shard.tp, rows = cfg.padded_vocab_size() / t, vocab_start = shard.rank * rows, vocab = cfg.vocab_size;
  // The tp layers' two collectives: where a column-parallel layer takes its input, where a
  // row-parallel layer's partial products are summed. Plain tp: identity / all-reduce (backward:
  // all-reduce / identity); sequence parallelism: all-gather / reduce-scatter of the rows, the
  // column-parallel layers keeping only their rank's rows for backward (parallel/sequence_parallel.h).
  using Fn = std::function<at::Tensor(const at::Tensor&)>;
  // y = enter(x) W^T + b for a column-parallel layer (b may be undefined).
  // A float8 layer passes its scaling with tp's amax reductions (tp_float8); null otherwise.
  using ColumnFn = std::function<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const Float8Scaling*)>;
  auto make_ops = [&](ColumnFn column, Fn leave) {
    auto ops = std::make_shared<LayerOps>();
    ops->column = [column, tp](const at::Tensor& x, const LinearImpl& l) {
      Float8Scaling s;
      return column(x, l.weight, l.bias, tp_float8(l, tp, /*column=*/true, s));
    };
    ops->row = [leave, tp](const at::Tensor& x, const LinearImpl& l) {
      Float8Scaling s;
      const at::Tensor y = leave(linear_product(x, l.weight, at::Tensor(), tp_float8(l, tp, /*column=*/false, s)));
      return l.bias.defined() ? y + l.bias : y;
    };
    ops->embed = [leave, vocab_start](const at::Tensor& idx, const at::Tensor& wte) {
      return leave(partial_embedding(idx, wte, vocab_start));
    };
    ops->loss = [tp, column, vocab_start, vocab](const at::Tensor& hidden, const at::Tensor& wte, const at::Tensor& targets,
                                                 Kernels kernels, const at::Tensor& rows) {
      // The tied output layer is column-parallel (this rank's vocabulary rows); the logits stay split.
      // Fused kernels on CUDA: the two-pass way, over the logits in their own dtype.
      // Masked targets: the rows of the sequence (gathered over tp under --sp) whose targets count.
      const at::Tensor logits = column(hidden, wte, at::Tensor(), nullptr);
      const bool two_pass = kernels_on(kernels, logits.is_cuda()) == Kernels::fused;
      at::Tensor flat = logits.reshape({-1, logits.size(-1)});
      if (rows.defined()) flat = flat.index_select(0, rows);
      return vocab_parallel_cross_entropy(flat, targets.reshape({-1}), vocab_start, vocab, tp, two_pass, kernels);
    };
    ops->reduce = leave;
    if (cfg.n_kv_head < t) {
      // Replicated kv heads: rank r keeps head r KV / t; its k and v rows' gradients are summed
      // over the t / KV ranks that share the head, so every copy takes the same step.
      const int64_t q_rows = cfg.n_head / t * cfg.head_dim(), kv = cfg.n_kv_head;
      const int64_t head = shard.rank * kv / t;
      ops->qkv = [tp, column, q_rows, head, kv](const at::Tensor& x, const LinearImpl& l) {
        auto tie = [&](const at::Tensor& w) {
          if (!w.defined()) return w;  // no bias
          const int64_t rest = w.size(0) - q_rows;
          return at::cat({w.narrow(0, 0, q_rows), SumOverKvSharers::apply(w.narrow(0, q_rows, rest), head, kv, capsule(tp))});
        };
        Float8Scaling s;
        return column(x, tie(l.weight), tie(l.bias), tp_float8(l, tp, /*column=*/true, s));
      };
    }
    ops->in_tp_region = [r = shard.rank](c10::Device device, const std::function<at::Tensor()>& fn) {
      return with_rank_rng(device, r, fn);
    };
    return ops;
  };
  auto plain = make_ops([tp](const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, const Float8Scaling* f8) {
                          return column_parallel_linear(x, w, b, tp, f8);
                        },
                        [tp](const at::Tensor& x) { return reduce_from_tp(x, tp); });
  if (!sequence_parallel) {
    shard.ops = std::move(plain);
    return shard;
  }
  auto sp = make_ops([tp](const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, const Float8Scaling* f8) {
                       return gathered_linear(x, w, b, tp, f8);
                     },
                     [tp](const at::Tensor& x) { return reduce_scatter_rows(x, 1, tp); });
  sp->seq_split = t;
  sp->seq_rows = [t, r = shard.rank](int64_t T, c10::Device device) {
    const int64_t n = T / t;
    return at::arange(r * n, (r + 1) * n, at::TensorOptions().dtype(at::kLong).device(device));
  };
  sp->gather_sequence = [tp](const at::Tensor& x) { return gather_rows(x, 1, *tp); };
  sp->unsplit = std::move(plain);
  shard.ops = std::move(sp);
  return shard;
}

namespace {
bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}
// How a parameter is split: along `dim`, each of `sections` (consecutive pieces of that dim,
// e.g. c_attn's q, k, v) divided into tp parts. Nothing for a replicated parameter.
// A section is cut into `parts` pieces (tp, or the kv heads when tp replicates them); rank r
// holds piece r parts / tp.
struct Section {
  int64_t size = 0, parts = 0;
};
struct Split {
  int64_t dim = 0;
  std::vector<Section> sections;
};
std::optional<Split> split_of(const std::string& name, const at::Tensor& whole, const GPTConfig& cfg, int64_t t) {
  if (name == "wte" || name == "lm_head") return Split{0, {{whole.size(0), t}}};  // vocabulary rows
  if (ends_with(name, "attn.c_attn.weight") || ends_with(name, "attn.c_attn.bias")) {
    const int64_t q = cfg.n_head * cfg.head_dim(), kv = cfg.n_kv_head * cfg.head_dim();
    const int64_t kv_parts = std::min(cfg.n_kv_head, t);
    return Split{0, {{q, t}, {kv, kv_parts}, {kv, kv_parts}}};
  }
  if (ends_with(name, "mlp.c_fc.weight") || ends_with(name, "mlp.c_fc.bias")) {
    // SwiGLU: gate's rows, then up's, each divided (rank r: [gate_r | up_r], as silu(gate) * up pairs them).
    if (cfg.swiglu()) return Split{0, {{whole.size(0) / 2, t}, {whole.size(0) / 2, t}}};
    return Split{0, {{whole.size(0), t}}};
  }
  if (ends_with(name, "c_proj.weight")) return Split{1, {{whole.size(1), t}}};
  return std::nullopt;
}
}  // namespace

bool is_tensor_parallel(const std::string& name) {
  return name == "wte" || name == "lm_head" || ends_with(name, "attn.c_attn.weight") || ends_with(name, "attn.c_attn.bias") ||
         ends_with(name, "mlp.c_fc.weight") || ends_with(name, "mlp.c_fc.bias") || ends_with(name, "c_proj.weight");
}

at::Tensor tp_slice_of(const std::string& name, const at::Tensor& w, const GPTConfig& cfg, int64_t t, int64_t r) {
  auto split = t > 1 ? split_of(name, w, cfg, t) : std::nullopt;
  if (!split) return w;
  std::vector<at::Tensor> parts;
  int64_t offset = 0;
  for (const auto& s : split->sections) {
    parts.push_back(w.narrow(split->dim, offset, s.size).chunk(s.parts, split->dim)[r * s.parts / t]);
    offset += s.size;
  }
  return at::cat(parts, split->dim);
}

at::Tensor tp_assemble(const std::string& name, const std::vector<at::Tensor>& pieces, at::IntArrayRef whole_shape,
                       const GPTConfig& cfg) {
  const int64_t t = static_cast<int64_t>(pieces.size());
  auto split = t > 1 ? split_of(name, at::empty(whole_shape, at::TensorOptions().device(at::kMeta)), cfg, t) : std::nullopt;
  if (!split) return pieces.at(0);
  std::vector<at::Tensor> sections;
  int64_t local_offset = 0;
  for (const auto& s : split->sections) {
    std::vector<at::Tensor> per_piece;  // piece j from the first rank holding it
    for (int64_t j = 0; j < s.parts; ++j) per_piece.push_back(pieces[j * t / s.parts].narrow(split->dim, local_offset, s.size / s.parts));
    sections.push_back(at::cat(per_piece, split->dim));
    local_offset += s.size / s.parts;
  }
  return at::cat(sections, split->dim);
}

GPT::TensorSlicer tp_slicer(const GPTConfig& cfg, int64_t tp, int64_t rank) {
  return [cfg, tp, rank](const std::string& name, const at::Tensor& whole) { return tp_slice_of(name, whole, cfg, tp, rank); };
}

std::vector<std::pair<at::Tensor, double>> tp_weighted_pieces(const std::string& name, const at::Tensor& local,
                                                              const GPT& model) {
  const GPTConfig& cfg = model.config();
  const int64_t t = model.shard().tp;
  const bool qkv = ends_with(name, "attn.c_attn.weight") || ends_with(name, "attn.c_attn.bias");
  if (!qkv || cfg.n_kv_head >= t) return {{local, 1.0}};
  const int64_t q_rows = cfg.n_head / t * cfg.head_dim();
  return {{local.narrow(0, 0, q_rows), 1.0},
          {local.narrow(0, q_rows, local.size(0) - q_rows), static_cast<double>(cfg.n_kv_head) / static_cast<double>(t)}};
}

at::Tensor grad_norm_tp(GPT& model, double grad_scale, const std::shared_ptr<Communicator>& tp, const GradOf& grad_at) {
  at::NoGradGuard no_grad;
  at::Tensor first;  // a gradient, for the device and dtype of the zeros below
  std::vector<std::pair<at::Tensor, double>> split_pieces, replicated_pieces;
  for (const auto& item : model.named_parameters()) {
    const at::Tensor g = grad_of(grad_at, item.value());
    if (!g.defined()) continue;
    if (!first.defined()) first = g;
    if (!is_tensor_parallel(item.key())) {
      replicated_pieces.push_back({g, 1.0});
      continue;
    }
    for (const auto& piece : tp_weighted_pieces(item.key(), g, model)) split_pieces.push_back(piece);
  }
  at::Tensor split_sq = weighted_sq_norm(split_pieces), replicated_sq = weighted_sq_norm(replicated_pieces);
  // A rank without gradients still joins the all-reduce (its tp peers wait in it), with zeros on
  // the run's device (a host zero would be handed to NCCL).
  const auto params = model.parameters();
  const auto opts = (first.defined() ? first : params.front()).options().dtype(at::kDouble);
  if (!split_sq.defined()) split_sq = at::zeros({}, opts);
  if (!replicated_sq.defined()) replicated_sq = at::zeros({}, opts);
  at::Tensor split_sum = split_sq.reshape({1}).clone();
  tp->all_reduce(split_sum, ReduceOp::Sum)->wait();
  at::Tensor total = (split_sum[0] + replicated_sq).sqrt().to(at::kFloat);
  if (grad_scale != 1.0) total = total / grad_scale;
  return total;
}

}  // namespace kiln
