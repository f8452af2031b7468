// plan/communication.cpp -- the collectives of a layout's step (plan/communication.h).
#include "plan/communication.h"

#include <algorithm>
#include <cmath>

#include "distributed/error.h"
#include "models/flops.h"
#include "parallel/pipeline_layout.h"

namespace kiln::plan {

namespace {

double ring(int64_t n) { return n <= 1 ? 0.0 : static_cast<double>(n - 1) / static_cast<double>(n); }

CommItem collective(std::string group, std::string what, int64_t n, double comm_bytes, double bw, std::string link,
                    Window w, int64_t occurrences, bool ring_factor = true) {
  CommItem it;
  it.group = std::move(group);
  it.what = std::move(what);
  it.group_size = n;
  it.comm_bytes = comm_bytes;
  it.wire_bytes = ring_factor ? comm_bytes * ring(n) : comm_bytes;
  it.busbw = bw;
  it.link = std::move(link);
  it.seconds = it.wire_bytes / bw;
  it.window = w;
  it.occurrences = occurrences;
  return it;
}

}  // namespace

// Rank order is tp fastest, then cp, then dp, then pp (distributed/mesh.h); nodes hold consecutive
// ranks. The dp x cp gradient group spans what the dp group spans.
Links links_for(const Layout& l, const ClusterSpec& c) {
  auto pick = [&](bool crosses, double& bw, std::string& name) {
    bw = crosses ? c.inter_node_busbw : c.intra_node_busbw;
    name = crosses ? "inter-node" : "intra-node";
  };
  Links k;
  pick(l.tp > c.devices_per_node, k.tp_bw, k.tp);
  pick(l.tp * l.cp > c.devices_per_node, k.cp_bw, k.cp);
  pick(l.tp * l.cp * l.dp > c.devices_per_node, k.dp_bw, k.dp);
  // an ep group: ep consecutive dp indices at one tp position (cp is 1 with MoE), tp x ep ranks
  // apart at most; the expert-data-parallel group strides over the whole dp range (dp's link)
  pick(l.tp * l.ep > c.devices_per_node, k.ep_bw, k.ep);
  pick(l.devices() > c.devices_per_node, k.pp_bw, k.pp);
  return k;
}


std::vector<CommItem> stage_comm(const Plan& p, const StagePlan& st, const Links& k) {
  const Layout& l = p.layout;
  const GPTConfig& m = p.model;
  const ClusterSpec& c = p.cluster;
  const int64_t N = l.grad_ranks(), K = l.grad_accum;  // DDP and ZeRO reduce over dp x cp
  const double Kd = static_cast<double>(K);
  std::vector<CommItem> out;

  const bool first = st.stage == 0, last = st.stage == l.pp - 1;
  const bool pipelined = l.pp > 1;

  // data parallel (exact kiln accounting). DDP runs with dp x cp > 1, or a named backend in a world
  // of one; ZeRO always has its dp communicator (kiln runs it under mpirun only), of one rank or more.
  if (N > 1 || l.comm_in_world_of_one || l.zero > 0) {
    const double psi = static_cast<double>(st.psi), psi_p = static_cast<double>(st.psi_padded);
    const bool reduce_each = l.zero_accum == ZeroAccum::Reduce && K > 1;
    // ZeRO: gradients reduce-scattered in rb bytes, parameters gathered in the weights' pb
    const double rb = l.reduce_bytes, pb = l.param_bytes;
    auto dp = [&](std::string what, double bytes, Window w, int64_t occ) {
      out.push_back(collective("dp", std::move(what), N, bytes, k.dp_bw, k.dp, w, occ));
    };
    switch (l.zero) {
      case 0:
        if (l.ep > 1) {
          // expert parallelism (runtime/trainer/trainer.cpp): DDP over dp for the dense parameters, a second
          // DDP over the expert-data-parallel group (dp / ep ranks, x cp) for the experts, which skips
          // its all-reduce when the group is one rank
          const double experts = static_cast<double>(st.psi_experts), edp = static_cast<double>(l.expert_copies());
          dp("dense gradient all-reduce (DDP, last micro-step)", 2.0 * rb * (psi - experts), Window::LastBackward, 1);
          if (edp > 1) {
            out.push_back(collective("edp", "expert gradient all-reduce, " + std::to_string(l.expert_copies()) + " copies (DDP, last micro-step)",
                                     l.expert_copies(), 2.0 * rb * experts, k.dp_bw, k.dp, Window::LastBackward, 1));
          }
        } else {
          dp("gradient all-reduce (DDP buckets, last micro-step)", 2.0 * l.reduce_bytes * psi, Window::LastBackward, 1);
        }
        break;
      case 1:
      case 2: {
        // under --ep the expert units go over the expert-data-parallel group (dp / ep ranks), and
        // not at all when it is one rank (parallel/zero.h)
        const double experts_p = static_cast<double>(st.psi_experts_padded), dense_p = psi_p - experts_p;
        const bool each = l.zero == 2 && reduce_each;
        const std::string tail = l.ep > 1 ? " (dense units)" : "";
        if (each) dp("gradient reduce-scatter (every micro-step)" + tail, Kd * rb * dense_p, Window::Backward, K);
        else dp("gradient reduce-scatter (last micro-step)" + tail, rb * dense_p, Window::LastBackward, 1);
        dp("parameter all-gather after the step" + tail, pb * dense_p, Window::Serial, 1);
        const int64_t M = l.ep > 1 ? l.expert_copies() : 1;
        if (M > 1 && experts_p > 0) {
          const std::string copies = ", " + std::to_string(M) + " copies";
          out.push_back(each ? collective("edp", "expert gradient reduce-scatter (every micro-step)" + copies, M, Kd * rb * experts_p,
                                          k.dp_bw, k.dp, Window::Backward, K)
                             : collective("edp", "expert gradient reduce-scatter (last micro-step)" + copies, M, rb * experts_p,
                                          k.dp_bw, k.dp, Window::LastBackward, 1));
          out.push_back(collective("edp", "expert parameter all-gather after the step" + copies, M, pb * experts_p, k.dp_bw, k.dp,
                                   Window::Serial, 1));
        }
        break;
      }
      case 3: {
        // the outer units stay gathered from the forward to the backward of a micro-step, and so
        // does the last block (parallel/zero.h). Under --ep an MoE block's experts are a unit of
        // their own over the expert-data-parallel group (M = dp / ep ranks; a group of one still
        // counts its gathers, comm_self.h, but skips its reduction, parallel/zero.h).
        int64_t outer = 0;
        for (size_t i = 0; i + static_cast<size_t>(st.blocks) < st.units.size(); ++i) outer += padded_numel(st.units[i], N);
        const double n0 = static_cast<double>(outer);
        const double n_last = st.blocks > 0 ? static_cast<double>(padded_numel(st.units.back(), N)) : 0.0;
        const double experts_p = static_cast<double>(st.psi_experts_padded), dense_p = psi_p - experts_p;
        const int64_t M = l.ep > 1 ? l.expert_copies() : 1;
        const bool last_moe = st.blocks > 0 && m.is_moe_layer(st.chunks.back().back()) && !st.expert_units.empty();
        const double e_last = last_moe ? static_cast<double>(padded_numel(st.expert_units.back(), M)) : 0.0;
        const std::string tail = l.ep > 1 ? " (dense units)" : "";
        // fp8 tensorwise: each block's float8 weights a unit gathered in one byte (parallel/zero.h,
        // "Float8 weights"); the last block's kept as its other units are
        const double f8_p = static_cast<double>(sum_padded(st.float8_units, N));
        const bool last_f8 = st.blocks > 0 && block_float8_gathered(m, l, st.chunks.back().back()).first > 0;
        const double f8_last = last_f8 ? static_cast<double>(padded_numel(st.float8_units.back(), N)) : 0.0;
        const double wide_p = dense_p - f8_p;  // gathered in pb bytes
        dp("forward parameter all-gathers" + tail + (f8_p > 0 ? " (float8 weights in 1 byte)" : ""), Kd * (pb * wide_p + f8_p),
           Window::Forward, K);
        dp("backward parameter all-gathers (outer unit and last block kept)" + tail + (f8_p > 0 ? " (float8 weights in 1 byte)" : ""),
           Kd * (pb * (wide_p - n0 - n_last) + (f8_p - f8_last)), Window::Backward, K);
        if (st.float8_weights > 0) {
          // once a step, at each float8 unit's first gather: its weights' amaxes, fp32, all-reduced
          // over the unit's group and over tp
          const double amax = 8.0 * static_cast<double>(st.float8_weights);
          dp("float8 weights' amax all-reduces (once a step)", amax, Window::Forward, 1);
          if (l.tp > 1) out.push_back(collective("tp", "float8 weights' amax all-reduces (once a step)", l.tp, amax, k.tp_bw, k.tp, Window::Forward, 1));
        }
        if (reduce_each) dp("gradient reduce-scatter (every micro-step)" + tail, Kd * rb * dense_p, Window::Backward, K);
        else dp("gradient reduce-scatter (last micro-step)" + tail, rb * dense_p, Window::LastBackward, 1);
        if (experts_p > 0) {
          const std::string copies = ", " + std::to_string(M) + " copies";
          auto edp = [&](std::string what, double bytes, Window w, int64_t occ) {
            out.push_back(collective("edp", std::move(what) + copies, M, bytes, k.dp_bw, k.dp, w, occ));
          };
          edp("expert forward parameter all-gathers", Kd * pb * experts_p, Window::Forward, K);
          edp("expert backward parameter all-gathers (the last block's kept)", Kd * pb * (experts_p - e_last), Window::Backward, K);
          if (M > 1 && reduce_each) edp("expert gradient reduce-scatter (every micro-step)", Kd * rb * experts_p, Window::Backward, K);
          else if (M > 1) edp("expert gradient reduce-scatter (last micro-step)", rb * experts_p, Window::LastBackward, 1);
        }
        break;
      }
    }
  }

  // The step's verdict (runtime/trainer/trainer_step.cpp): [loss, non-finite] (8 B) over dp x cp for DDP
  // with more than one such rank (a world of one under mpirun decides its step alone); [loss,
  // non-finite, grad norm^2] (12 B) under ZeRO, over dp x cp, or over the world with tp; under pp
  // always the 12 B over the whole world (every stage's squared norm, the loss from the last stage).
  // MoE: every MoE layer's routing row (E counts, admitted, L_aux, L_z; zeros for another
  // stage's layers) rides in it before the norm, X = n_moe_layers (E + 3) floats more; under --sp
  // over dp x cp x tp even for DDP (the tp ranks' rows are parts).
  const double moe_floats = static_cast<double>(m.n_moe_layers() * (m.n_experts + 3));
  const std::string moe_rows = m.is_moe() ? ", MoE routing rows" : "";
  if (pipelined) {
    out.push_back(collective("world", "step verdict all-reduce [loss, non-finite" + moe_rows + ", grad norm^2]", l.devices(),
                             2 * 4 * (3 + moe_floats), k.pp_bw, k.pp, Window::Serial, 1));
  } else if (l.zero > 0) {
    out.push_back(collective(l.tp > 1 ? "world" : "dp", "step verdict all-reduce [loss, non-finite" + moe_rows + ", grad norm^2]",
                             N * l.tp, 2 * 4 * (3 + moe_floats), k.dp_bw, k.dp, Window::Serial, 1));  // dp x cp x tp: within a node iff dp is
  } else if (m.is_moe() && l.sp) {  // MoE under --sp: the tp ranks' routing rows are parts of one sequence's, summed over tp too
    out.push_back(collective("world", "step verdict all-reduce [loss, non-finite" + moe_rows + "]", N * l.tp, 2 * 4 * (2 + moe_floats),
                             k.dp_bw, k.dp, Window::Serial, 1));
  } else if (N > 1) {
    out.push_back(collective("dp", "step verdict all-reduce [loss, non-finite" + moe_rows + "]", N, 2 * 4 * (2 + moe_floats), k.dp_bw,
                             k.dp, Window::Serial, 1));
  }

  // tokens per micro-batch on this rank: its b T / cp positions under context parallelism
  const double tok = static_cast<double>(l.micro_batch * m.seq_len / l.cp);
  const double d = static_cast<double>(m.d_model), a = l.compute_bytes;
  // tensor parallel: on the critical path (Megatron's all-reduces block the next GEMM)
  if (l.tp > 1) {
    // kiln (parallel/tensor_parallel.h): forward, the row-parallel outputs in the compute dtype
    // (a bytes; again in full recomputation); backward, the column-parallel inputs' gradients, in
    // the dtype of the norm outputs they flow into (norm_output_bytes): fp32 under CUDA autocast
    // for layer_norm (on its fp32 list) and with fp32 weights; the residual stream's 16 bits on
    // the CPU with 16-bit weights (CPU autocast runs layer_norm in its input's dtype), and for
    // rms_norm, on no autocast list, on a GPU too.
    const double ln = norm_output_bytes(m, l);
    const bool full = l.recompute == Recompute::Full;
    const double blocks = static_cast<double>(st.blocks);
    // an MoE block (replicated over tp) has attention's collectives only: half a dense block's
    const double tp_blocks = blocks - 0.5 * static_cast<double>(st.moe_blocks);
    // --precision fp8 (kernels/float8.h): per micro-step, each float8 layer's amax all-reduces
    // over tp (one fp32 each, 8 bytes; rowwise a row of them), and under --sp the column layers'
    // changed gathers (f8_sp, added to the sp entry below):
    //   tensorwise  column: W's (n) and, under sp, x's rows' amax each forward, g's (n) in backward;
    //               row: W's and x's (k) each forward. sp: x's rows gathered in 1 byte, not a; no
    //               gather in backward (q_x kept); dX reduce-scattered in a (x cast to the compute
    //               dtype), not the norm output's ln.
    //   rowwise     column, backward: g's rows (b T of them) and W's columns (d) over n; row, each
    //               forward: x's rows (b T) and W's rows (d) over k. sp: the 16-bit gather
    //               forward, none in backward (x kept), dX in a.
    // W's amaxes: outside ZeRO-3 once a step (f8_amax_step: the step's first forward makes the
    // forms it keeps, GPT::keep_float8_weights -- rowwise both, W's columns with its rows); under
    // ZeRO-3's 8-bit gather the engine's once a step (the dp section); ZeRO-3's 16-bit gathers
    // (rowwise, --offload all) each pass.
    double f8_amax = 0, f8_amax_step = 0, f8_sp = 0;
    if (l.float8) {
      const double passes = full ? 2.0 : 1.0;
      const bool kept = l.zero != 3;
      for (const auto& chunk : st.chunks)
        for (int64_t i : chunk) {
          const Float8Layers f8 = block_float8_layers(m, l, i);
          const double cols = (f8.c_attn ? 1.0 : 0.0) + (f8.c_fc ? 1.0 : 0.0), rows = (f8.attn_proj ? 1.0 : 0.0) + (f8.mlp_proj ? 1.0 : 0.0);
          if (l.float8 == 1) {
            f8_amax += passes * (cols * (l.sp ? 16.0 : 8.0) + rows * 16.0) + cols * 8.0;
            // ZeRO-3's 8-bit gather: W comes quantised (its amax once a step, above), not each pass
            if (float8_gathered(l)) f8_amax -= passes * 8.0 * static_cast<double>(block_float8_gathered(m, l, i).second);
            if (kept) {
              f8_amax -= passes * 8.0 * (cols + rows);
              f8_amax_step += 8.0 * (cols + rows);
            }
            if (l.sp) f8_sp += cols * (-passes * (a - 1.0) * tok * d - a * tok * d + (a - ln) * tok * d);
          } else {
            f8_amax += passes * rows * 8.0 * (tok + d) + cols * 8.0 * (tok + d);
            if (kept) {
              f8_amax -= passes * rows * 8.0 * d + cols * 8.0 * d;
              f8_amax_step += (rows + cols) * 8.0 * d;
            }
            if (l.sp) f8_sp += cols * (-a * tok * d + (a - ln) * tok * d);
          }
        }
    }
    if (l.sp) {
      // sequence parallelism (parallel/sequence_parallel.h): per layer and forward pass, c_attn's
      // and c_fc's inputs gathered (cast to the compute dtype first) and the two row-parallel
      // outputs reduce-scattered, 4 b T d a; backward, the column inputs gathered again for dW and
      // the row outputs' gradients gathered (4 b T d a), the column inputs' gradients
      // reduce-scattered in the LayerNorm outputs' dtype (2 b T d ln)
      const double forwards = full ? 2.0 : 1.0;
      out.push_back(collective("tp", std::string("block all-gathers + reduce-scatters (forward") + (full ? " x 2, recomputed" : "") +
                                         "; backward with the column inputs gathered again" +
                                         (st.moe_blocks > 0 ? "; half that in an MoE block)" : ")"),
                               l.tp, Kd * (tp_blocks * ((forwards + 1) * 4 * tok * d * a + 2 * tok * d * ln) + f8_sp), k.tp_bw, k.tp,
                               Window::Serial, K));
      // an MoE layer's routing (models/moe.h): the k int64 choices of the rank's rows gathered
      // over tp, the cp chunk's b T / c k x 8 bytes, every forward (the recomputed one too)
      if (st.moe_blocks > 0) {
        out.push_back(collective("tp", "MoE routing choices all-gathered (per MoE layer and forward)", l.tp,
                                 Kd * static_cast<double>(st.moe_blocks) * forwards * tok * static_cast<double>(m.top_k) * 8.0,
                                 k.tp_bw, k.tp, Window::Serial, K));
      }
    } else {
      const double fwd = full ? 4.0 : 2.0;
      const double per_micro = tp_blocks * (fwd * 2 * tok * d * a + 2.0 * 2 * tok * d * ln);
      out.push_back(collective("tp", "block activation all-reduces (2 forward" + std::string(full ? " + 2 recomputed" : "") +
                                         ", 2 backward per layer and micro-batch" +
                                         (st.moe_blocks > 0 ? "; half that in an MoE block)" : ")"),
                               l.tp, Kd * per_micro, k.tp_bw, k.tp, Window::Serial, K));
    }
    if (f8_amax > 0 || f8_amax_step > 0) {
      out.push_back(collective("tp", std::string("float8 amax all-reduces (") + (l.float8 == 1 ? "tensorwise" : "rowwise") +
                                         ": the split tensors' scales, per layer and pass; W's once a step)",
                               l.tp, Kd * f8_amax + f8_amax_step, k.tp_bw, k.tp, Window::Serial, K));
    }
    // the gradient norm's split part, summed over tp once per step (one double); under ZeRO or
    // pp the squared norm rides in the verdict all-reduce instead
    if (l.zero == 0 && !pipelined) {
      out.push_back(collective("tp", "gradient-norm all-reduce", l.tp, 2 * 8, k.tp_bw, k.tp, Window::Serial, 1));
    }
    // the embedding: an all-reduce (sp: a reduce-scatter forward and an all-gather backward) of
    // b T d in wte's dtype, the same bytes; the head: its input's gradient all-reduced in ln_f's
    // dtype (sp: ln_f's output gathered in the compute dtype forward and again backward, its
    // gradient reduce-scattered); the cross-entropy's max, sum-exp and target
    double edge = 0;
    if (first) edge += 2 * tok * d * l.param_bytes;
    if (last) edge += (l.sp ? 2 * tok * d * a + tok * d * ln : 2 * tok * d * ln) + 3 * 2 * tok * 4;
    const char* what = first && last ? (l.sp ? "embedding / head gathers and reduce-scatters, cross-entropy all-reduces"
                                             : "embedding / head / cross-entropy all-reduces")
                       : first       ? (l.sp ? "embedding reduce-scatter + all-gather" : "embedding all-reduce (forward)")
                                     : "head input-gradient / cross-entropy all-reduces";
    if (edge > 0) out.push_back(collective("tp", what, l.tp, Kd * edge, k.tp_bw, k.tp, Window::Serial, K));
    if (l.sp) {
      // the gradients of the parameters tp replicates, summed over tp by a hook in every backward
      // (each rank saw only its rows), in the parameters' dtype: the norms and the two
      // row-parallel biases of each block (6 d for GPT-2; 2 d RMSNorm weights and no bias for
      // Llama), wpe [T, d] on the first stage (learned positions only), ln_f on the last
      // Llama), wpe [T, d] on the first stage (learned positions only), ln_f on the last; an MoE
      // block's norms, attention c_proj bias and the whole MoE layer (its experts -- E / ep under
      // --ep -- and the router: the layer is replicated over tp)
      const double norm = static_cast<double>(norm_numel(m));
      const double per_block = 2 * norm + (m.linear_bias() ? 2 * d : 0.0);
      const double moe_layer = static_cast<double>(m.n_experts / l.ep * mlp_numel(m, 1) + m.n_experts * m.d_model);
      const double per_moe_block = 2 * norm + (m.linear_bias() ? d : 0.0) + moe_layer;
      const double moe = static_cast<double>(st.moe_blocks);
      const double replicated = (blocks - moe) * per_block + moe * per_moe_block +
                                (first ? static_cast<double>(m.position_params()) : 0.0) + (last ? norm : 0.0);
      out.push_back(collective("tp", "replicated parameters' gradient all-reduces (every backward)", l.tp,
                               Kd * 2 * l.param_bytes * replicated, k.tp_bw, k.tp, Window::Serial, K));
    }
  }
  // expert parallel (parallel/expert_parallel.h), over the ep group; serial: the experts wait
  // for their rows, and the counts' host read decides the splits
  if (l.ep > 1) {
    const bool full = l.recompute == Recompute::Full;
    const double forwards = full ? 2.0 : 1.0, moe = static_cast<double>(st.moe_blocks);
    const double E = static_cast<double>(m.n_experts), kk = static_cast<double>(m.top_k);
    // exact: every MoE layer's E int64 counts in every forward (the recomputed one too)
    if (st.moe_blocks > 0) {
      out.push_back(collective("ep", std::string("all-to-all counts, 8 E per MoE layer and forward") + (full ? " (x 2)" : ""),
                               l.ep, Kd * moe * forwards * 8.0 * E, k.ep_bw, k.ep, Window::Serial, K));
      // estimate: the rows at a balanced load without dropping, k b T each way; to the experts in
      // ln_2's output dtype (b_in), back in the experts' output dtype (b_out = the compute dtype),
      // the backward's gradients in the same two dtypes the other way
      const EpRowBytes b = ep_row_bytes(l);
      const double b_in = b.in, b_out = b.out;
      CommItem rows = collective("ep", std::string("all-to-all rows, ") + (full ? "2 fwd" : "fwd") + " + bwd (estimate: balanced)",
                                 l.ep, Kd * moe * (forwards + 1.0) * kk * tok * d * (b_in + b_out), k.ep_bw, k.ep, Window::Serial, K);
      rows.estimate = true;
      out.push_back(rows);
    }
    // the norm's expert part (clip_grad_norm_ep, DDP on one stage): one fp64 summed over ep; ZeRO's
    // shards and the pipeline's shares are summed with the verdict instead
    if (l.zero == 0 && !pipelined) {
      out.push_back(collective("ep", "gradient-norm all-reduce (the experts' squares)", l.ep, 2 * 8, k.ep_bw, k.ep, Window::Serial, 1));
    }
  }
  // context parallel (parallel/context_parallel.h): per layer and micro-batch one all-gather of
  // the stacked K and V, output [2, b, KV_t, T, h] in the compute dtype (again in a recomputed
  // forward), and one reduce-scatter of their gradients, the same size; blocking, so serial
  if (l.cp > 1) {
    const int64_t kv_t = (m.n_kv_head >= l.tp ? m.n_kv_head / l.tp : 1) * m.head_dim();
    const double gathered = 2.0 * static_cast<double>(l.micro_batch * m.seq_len * kv_t) * a;
    const double passes = l.recompute == Recompute::Full ? 3.0 : 2.0;
    out.push_back(collective("cp", std::string("K/V all-gather + gradient reduce-scatter (per layer: forward") +
                                       (l.recompute == Recompute::Full ? ", recomputed forward" : "") + ", backward)",
                             l.cp, Kd * static_cast<double>(st.blocks) * passes * gathered, k.cp_bw, k.cp, Window::Serial, K));
    // --precision fp8: the float8 layers' amaxes over the rows (tokens) cp splits (Float8Scaling::m):
    // tensorwise, x's each forward and g's in backward (8 bytes each); rowwise, dW's scales in
    // backward, g's columns (this rank's N) and x's (its K), 8 bytes a column
    if (l.float8) {
      const double passes = l.recompute == Recompute::Full ? 2.0 : 1.0, t = static_cast<double>(l.tp);
      const double dd = static_cast<double>(m.d_model), hd = static_cast<double>(m.head_dim()), q = static_cast<double>(m.attn_width());
      const double kv_heads = static_cast<double>(m.n_kv_head >= l.tp ? m.n_kv_head / l.tp : 1);
      const double f = static_cast<double>(m.mlp_hidden()), fc = m.swiglu() ? 2 * f : f;
      double bytes = 0;
      for (const auto& chunk : st.chunks)
        for (int64_t i : chunk) {
          const Float8Layers f8 = block_float8_layers(m, l, i);
          if (l.float8 == 1) {
            bytes += (passes + 1) * 8.0 * ((f8.c_attn ? 1 : 0) + (f8.attn_proj ? 1 : 0) + (f8.c_fc ? 1 : 0) + (f8.mlp_proj ? 1 : 0));
          } else {
            bytes += (f8.c_attn ? 8.0 * (q / t + 2 * kv_heads * hd + dd) : 0) + (f8.attn_proj ? 8.0 * (dd + q / t) : 0) +
                     (f8.c_fc ? 8.0 * (fc / t + dd) : 0) + (f8.mlp_proj ? 8.0 * (dd + f / t) : 0);
          }
        }
      if (bytes > 0) {
        out.push_back(collective("cp", std::string("float8 amax all-reduces over the sequence's rows (") +
                                           (l.float8 == 1 ? "tensorwise" : "rowwise") + ")",
                                 l.cp, Kd * bytes, k.cp_bw, k.cp, Window::Serial, K));
      }
    }
    // an MoE layer's routing (models/moe.h): the k int64 choices of the sequence's b T positions
    // gathered over cp, every forward (the recomputed one too)
    if (st.moe_blocks > 0) {
      const double forwards = l.recompute == Recompute::Full ? 2.0 : 1.0;
      out.push_back(collective("cp", "MoE routing choices all-gathered (per MoE layer and forward)", l.cp,
                               Kd * static_cast<double>(st.moe_blocks) * forwards *
                                   static_cast<double>(l.micro_batch * m.seq_len * m.top_k) * 8.0,
                               k.cp_bw, k.cp, Window::Serial, K));
    }
  }
  // pipeline (parallel/pipeline.h): the bytes this rank sends. Per micro-batch its output
  // [b, T, d] ([b, T/t, d] under sp) forward (not the last stage) and its input's gradient backward (not the first), in
  // the residual stream's dtype (the parameters'); once per step the tied wte's gradient (fp32,
  // the main grad for 16-bit weights) to the other end (first <-> last stage): the whole V'/t x d
  // slice, or under ZeRO this rank's shard of the wte unit.
  // Interleaved (--pp-virtual V, parallel/pipeline_interleaved.h): each chunk sends its output
  // on and its input's gradient back -- V activations (V - 1 on the last stage, whose last chunk
  // takes the loss) and V gradients (V - 1 on the first) per micro-batch.
  if (pipelined) {
    const double V = static_cast<double>(l.pp_virtual);
    const double directions = (first ? V - 1.0 : V) + (last ? V - 1.0 : V);
    const std::string dt = l.param_bytes == 4 ? " (fp32)" : " (16-bit)";
    const std::string what = l.pp_virtual > 1 ? "chunk boundary activations forward and gradients backward (" +
                                                    std::to_string(l.pp_virtual) + " chunks)" + dt
                             : first ? "boundary activations sent forward" + dt
                             : last  ? "boundary gradients sent backward" + dt
                                     : "boundary activations forward and gradients backward" + dt;
    const double rows = l.sp ? tok / static_cast<double>(l.tp) : tok;  // --sp: the rank's rows of the sequence
    out.push_back(collective("pp", what, 2, Kd * directions * rows * d * l.param_bytes, k.pp_bw, k.pp, Window::Serial, K,
                             /*ring_factor=*/false));
    if ((first || last) && m.tie_embeddings) {  // an untied lm_head shares nothing between the stages
      const int64_t wte = m.padded_vocab_size() * m.d_model / l.tp;
      const double sent = l.zero > 0 ? 4.0 * static_cast<double>(padded_numel(wte, N) / N) : 4.0 * static_cast<double>(wte);
      out.push_back(collective("pp", std::string("tied wte gradient sent to the ") + (first ? "last" : "first") + " stage" +
                                         (l.zero > 0 ? " (its dp shard)" : ""),
                               2, sent, k.pp_bw, k.pp, Window::Serial, 1, /*ring_factor=*/false));
    }
  }
  // offload: host <-> device copies and the host AdamW
  if (l.offload != Offload::None) {
    const double shard = static_cast<double>(st.psi_padded / N);
    auto host = [&](std::string what, double bytes, Window w, int64_t occ) {
      out.push_back(collective("host", std::move(what), 1, bytes, c.host_link, "pcie", w, occ, false));
    };
    const double pb = l.param_bytes;  // the fp32 gradient shard down, the working weights' shard up
    // Offload all with streamed gradients: every micro-step's reduced shard goes down (the first
    // copied into the host shard, the rest added by the host worker); else the step's one copy.
    // Both on the compute stream today: exposed.
    const bool streamed = l.offload == Offload::All && l.zero >= 2 && (l.zero_accum == ZeroAccum::Reduce || K == 1);
    if (streamed) host("gradient shard to host (every micro-step)", Kd * 4 * shard, Window::Serial, K);
    else host("gradient shard to host", 4 * shard, Window::Serial, 1);
    if (l.offload == Offload::Optimizer) {
      host("parameter shard to device", pb * shard, Window::Serial, 1);
    } else {
      host("parameter shard to device before each forward", Kd * pb * shard, Window::Forward, K);
      host("parameter shard to device before each backward", Kd * pb * shard, Window::Backward, K);
    }
    CommItem adam;
    adam.group = "host";
    adam.what = l.delayed_update ? "host AdamW over the shard (delayed a step)"
                : l.zero == 3    ? "host AdamW over the shard (unit by unit, under the next forward's gathers)"
                                 : "host AdamW over the shard";
    adam.link = "host-cpu";
    adam.busbw = c.host_adam_rate / static_cast<double>(std::min(c.devices_per_node, l.devices()));
    adam.seconds = shard / adam.busbw;  // busbw here: parameters/s this rank's share of the host gives
    // ZeRO-3: the step returns with the updates queued and each unit's next gather waits for its
    // own, so the next forward's compute hides them (parallel/zero.h, "The overlapped host step").
    // ZeRO-1/2 all-gather every unit before the next forward: exposed.
    // The delayed update: waited for only at the next step's step, behind all of its compute.
    if (l.zero == 3) adam.window = Window::FirstForward;
    if (l.delayed_update) adam.window = Window::NextStep;
    out.push_back(adam);
  }
  return out;
}

// Serial communication plus what the compute windows cannot hide (section 5).
double exposed_seconds(const std::vector<CommItem>& items, double t_f, double t_b, int64_t K) {
  double serial = 0, net_f = 0, net_b = 0, net_last = 0, host_f = 0, host_b = 0, host_last = 0, first_f = 0, next_step = 0;
  for (const auto& it : items) {
    const bool host = it.group == "host";
    const double each = it.seconds / static_cast<double>(std::max<int64_t>(1, it.occurrences));
    switch (it.window) {
      case Window::Serial: serial += it.seconds; break;
      case Window::Forward: (host ? host_f : net_f) += each; break;
      case Window::Backward: (host ? host_b : net_b) += each; break;
      case Window::LastBackward: (host ? host_last : net_last) += it.seconds; break;
      case Window::FirstForward: first_f += it.seconds; break;
      case Window::NextStep: next_step += it.seconds; break;
    }
  }
  const double Kd = static_cast<double>(K);
  const double fwd = Kd * std::max(0.0, std::max(net_f, host_f) - t_f);
  const double bwd = (Kd - 1) * std::max(0.0, std::max(net_b, host_b) - t_b) +
                     std::max(0.0, std::max(net_b + net_last, host_b + host_last) - t_b);
  // The host's CPU work under one forward: its cores, not a link the forward's copies use.
  return serial + fwd + bwd + std::max(0.0, first_f - t_f) + std::max(0.0, next_step - Kd * (t_f + t_b));
}

}  // namespace kiln::plan
