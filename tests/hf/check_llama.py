#!/usr/bin/env python3
"""Compare kiln's Llama-family forward with transformers' on the same weights and tokens.

    check_llama.py DIR [--break gate-up]

DIR is what tests/hf/llama_fixture.cpp wrote: kiln.safetensors (kiln's parameter names and
layout), kiln_config.json, tokens.json (with kiln's loss) and logits.safetensors (kiln's logits).
The model is built with transformers (LlamaForCausalLM, Qwen2ForCausalLM for "qwen2", Qwen3ForCausalLM
for "qwen3"), fp32,
eager attention; every parameter is set from kiln's tensors through the mapping below, and the
load must use every key (none missing, none unexpected). Then its logits and loss on the same
inputs: one JSON line {"loss", "kiln_loss", "loss_rel", "logits_max_rel", ...}.

The mapping (kiln -> transformers), a = heads x head width (d but for Qwen3), kv = kv heads x head
width, F feed-forward:
    wte[:V]                      model.embed_tokens.weight
    h.N.ln_1.weight              model.layers.N.input_layernorm.weight
    h.N.attn.c_attn.weight       rows [0, a) q_proj, [a, a + kv) k_proj, [a + kv, a + 2kv) v_proj
    h.N.attn.q_norm.weight       model.layers.N.self_attn.q_norm.weight (Qwen3; k_norm alike)
    h.N.attn.c_attn.bias         the same rows' biases (Qwen2)
    h.N.attn.c_proj.weight       model.layers.N.self_attn.o_proj.weight
    h.N.ln_2.weight              model.layers.N.post_attention_layernorm.weight
    h.N.mlp.c_fc.weight          rows [0, F) gate_proj, [F, 2F) up_proj
    h.N.mlp.c_proj.weight        model.layers.N.mlp.down_proj.weight
    ln_f.weight                  model.norm.weight
    lm_head[:V]                  lm_head.weight (tied: wte)
--break gate-up swaps gate_proj and up_proj in layer 0: the comparison must then fail (the
caller checks that the difference is large).
Exit codes: 0 ok, 1 check failed, 2 bad arguments, 77 transformers not installed.
"""
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def main():
    if len(sys.argv) not in (2, 4) or (len(sys.argv) == 4 and sys.argv[2:] != ["--break", "gate-up"]):
        print("usage: check_llama.py DIR [--break gate-up]", file=sys.stderr)
        sys.exit(2)
    d = sys.argv[1]
    broken = len(sys.argv) == 4
    try:
        import torch
        from safetensors.torch import load_file
        from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM
    except ImportError as e:
        print(f"SKIP: {e}")
        sys.exit(77)
    c = json.load(open(os.path.join(d, "kiln_config.json")))
    kiln = load_file(os.path.join(d, "kiln.safetensors"))
    V, D, L = c["vocab_size"], c["d_model"], c["n_layer"]
    H, KV, F = c["n_head"], c["n_kv_head"], c["ffn_hidden"]
    hd = c.get("head_dim", D // H)
    A, kv = H * hd, KV * hd
    rope = {"rope_type": "default", "rope_theta": c["rope_theta"]}
    if c["rope_factor"]:
        rope = {"rope_type": "llama3", "rope_theta": c["rope_theta"], "factor": c["rope_factor"],
                "low_freq_factor": c["rope_low_freq_factor"], "high_freq_factor": c["rope_high_freq_factor"],
                "original_max_position_embeddings": c["rope_original_context"]}
    common = dict(vocab_size=V, hidden_size=D, intermediate_size=F, num_hidden_layers=L, num_attention_heads=H,
                  num_key_value_heads=KV, max_position_embeddings=c["seq_len"], rms_norm_eps=c["norm_eps"],
                  rope_parameters=rope, tie_word_embeddings=c["tie_embeddings"], hidden_act="silu",
                  attention_dropout=0.0)
    if c["arch"] == "qwen2":
        cfg, cls = Qwen2Config(**common, use_sliding_window=False), Qwen2ForCausalLM
    elif c["arch"] == "qwen3":
        cfg, cls = Qwen3Config(**common, head_dim=hd, attention_bias=False, use_sliding_window=False), Qwen3ForCausalLM
    else:
        cfg, cls = LlamaConfig(**common, attention_bias=False, mlp_bias=False), LlamaForCausalLM
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = cls(cfg).float().eval()

    sd = {"model.embed_tokens.weight": kiln["wte"][:V], "model.norm.weight": kiln["ln_f.weight"]}
    if not c["tie_embeddings"]:
        sd["lm_head.weight"] = kiln["lm_head"][:V]
    for n in range(L):
        k, p = f"h.{n}.", f"model.layers.{n}."
        w = kiln[k + "attn.c_attn.weight"]
        sd[p + "self_attn.q_proj.weight"], sd[p + "self_attn.k_proj.weight"], sd[p + "self_attn.v_proj.weight"] = \
            w[:A], w[A:A + kv], w[A + kv:]
        if k + "attn.c_attn.bias" in kiln:
            b = kiln[k + "attn.c_attn.bias"]
            sd[p + "self_attn.q_proj.bias"], sd[p + "self_attn.k_proj.bias"], sd[p + "self_attn.v_proj.bias"] = \
                b[:A], b[A:A + kv], b[A + kv:]
        sd[p + "self_attn.o_proj.weight"] = kiln[k + "attn.c_proj.weight"]
        if k + "attn.q_norm.weight" in kiln:
            sd[p + "self_attn.q_norm.weight"] = kiln[k + "attn.q_norm.weight"]
            sd[p + "self_attn.k_norm.weight"] = kiln[k + "attn.k_norm.weight"]
        sd[p + "input_layernorm.weight"] = kiln[k + "ln_1.weight"]
        sd[p + "post_attention_layernorm.weight"] = kiln[k + "ln_2.weight"]
        fc = kiln[k + "mlp.c_fc.weight"]
        gate, up = fc[:F], fc[F:]
        if broken and n == 0:
            gate, up = up, gate
        sd[p + "mlp.gate_proj.weight"], sd[p + "mlp.up_proj.weight"] = gate, up
        sd[p + "mlp.down_proj.weight"] = kiln[k + "mlp.c_proj.weight"]
    used = len(sd) + 0
    kiln_keys = set(kiln) - {"lm_head"} if c["tie_embeddings"] else set(kiln)
    mapped = 2 + (0 if c["tie_embeddings"] else 1) + sum(
        6 + (f"h.{n}.attn.c_attn.bias" in kiln) + 2 * (f"h.{n}.attn.q_norm.weight" in kiln) for n in range(L))
    if mapped != len(kiln_keys):
        print(f"check_llama: kiln has {len(kiln_keys)} tensors, the mapping uses {mapped}", file=sys.stderr)
        sys.exit(1)
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [m for m in missing if not (c["tie_embeddings"] and m == "lm_head.weight")]
    if missing or unexpected:
        print(f"check_llama: missing {missing}, unexpected {unexpected}", file=sys.stderr)
        sys.exit(1)
    if c["tie_embeddings"] and model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr():
        print("check_llama: lm_head is not tied to embed_tokens", file=sys.stderr)
        sys.exit(1)

    tok = json.load(open(os.path.join(d, "tokens.json")))
    seq = torch.tensor(tok["sequences"], dtype=torch.long)
    T = seq.shape[1] - 1
    with torch.no_grad():
        logits = model(input_ids=seq[:, :T]).logits.float()
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), seq[:, 1:].reshape(-1)).item()
    kl = load_file(os.path.join(d, "logits.safetensors"))["logits"]
    logits_rel = ((logits - kl).abs().max() / kl.abs().max()).item()
    out = {"loss": loss, "kiln_loss": tok["kiln_loss"], "loss_rel": abs(loss - tok["kiln_loss"]) / abs(tok["kiln_loss"]),
           "logits_max_rel": logits_rel, "tensors": used, "arch": c["arch"]}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
