#!/usr/bin/env bash
# tests/hf/chat.sh -- instruction data (issue 51, part 2): kiln prep --chat renders conversations
# with the tokenizer's own chat template and writes beside each shard which tokens are trained on;
# training and kiln eval take the loss over those alone; checkpoints carry the template.
# Two tokenizers made here with the tokenizers library (no download), each with its family's chat
# template in tokenizer_config.json: Llama 3's (the 8B Instruct template: bos, headers, <|eot_id|>)
# and Qwen2's (<|im_start|> / <|im_end|>, the default system prompt). 40 conversations (system
# prompts on some, 1-3 user/assistant exchanges). For each:
#   - kiln prep --chat: the shard's ids are, conversation by conversation, transformers'
#     apply_chat_template ids (end-of-text first where the template does not open with it), and its
#     mask is transformers' own assistant mask (return_assistant_tokens_mask) from a copy of the
#     template with {% generation %} markers around the assistant's content and end of turn -- the
#     template kiln read has none, so kiln found the turns by its prefix rule (tools/chat_data.py);
#   - tiny-llama trains 30 steps on it (the records' loss_tokens below their tokens) and saves;
#   - kiln eval of the checkpoint on the shard equals the loss transformers computes on the same
#     samples (kiln's windows of 65 tokens, LlamaForCausalLM on the checkpoint, labels -100 where
#     the mask is 0): within 1e-5 relative (fp32 both; the products summed in another order,
#     ~1e-7, tests/hf/llama_parity.sh's bound), while the loss over every target is > 1e-2 away;
#   - the checkpoint's tokenizer_config.json holds the template: AutoTokenizer on the checkpoint
#     gives the same apply_chat_template ids, and transformers' text-generation pipeline takes
#     a list of messages on it.
# And kiln prep --chat --chat-template with Qwen2's marked template (transformers' assistant mask
# then decides) writes the same ids and mask as the prefix rule did. Bad input: --chat without a
# tokenizer, a tokenizer without a template, a line without messages: one line each, exit 2.
# Skipped (exit 77) when KILN_PYTHON cannot import transformers.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../cli/common.sh"
need_python transformers tokenizers torch
cd "$work"
"$py" - <<'PY'
import json, os, random
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
random.seed(7)
words = "the quick brown fox jumps over a lazy dog while kiln trains models what is why how answer question please thanks".split()
def sentence(n): return " ".join(random.choice(words) for _ in range(n)).capitalize() + random.choice([".", "?", "!"])
convs = []
for k in range(40):
    msgs = []
    if k % 3 == 0:
        msgs.append({"role": "system", "content": "You are terse. " + sentence(4)})
    for turn in range(1 + k % 3):
        msgs.append({"role": "user", "content": sentence(5 + k % 7)})
        msgs.append({"role": "assistant", "content": sentence(6 + (k * 3 + turn) % 11)})
    convs.append({"messages": msgs})
with open("chat.jsonl", "w") as f:
    for c in convs:
        f.write(json.dumps(c) + "\n")
corpus = [m["content"] for c in convs for m in c["messages"]]
pat = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
       r"\s+(?!\S)|\s+")
def make(specials, path, config):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(pat), behavior="isolated", invert=False),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=380, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                        special_tokens=specials))
    os.makedirs(path, exist_ok=True)
    tok.save(f"{path}/tokenizer.json")
    json.dump(config, open(f"{path}/tokenizer_config.json", "w"), indent=1)
# Llama 3 8B Instruct's template, as its tokenizer_config.json has it; then the same text with
# transformers' generation markers around what the assistant says (content and <|eot_id|>).
LLAMA3 = ("{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + "
          "'<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
          "{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
LLAMA3_MARKED = ("{% for message in messages %}{% if loop.index0 == 0 %}{{ bos_token }}{% endif %}{{ '<|start_header_id|>' + message['role'] + "
                 "'<|end_header_id|>\n\n' }}{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] | trim + '<|eot_id|>' }}"
                 "{% endgeneration %}{% else %}{{ message['content'] | trim + '<|eot_id|>' }}{% endif %}{% endfor %}{% if add_generation_prompt %}"
                 "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
# Qwen2-Instruct's template, and the same marked.
QWEN2 = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful "
         "assistant.<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
         "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
QWEN2_MARKED = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful "
                "assistant.<|im_end|>\n' }}{% endif %}{{ '<|im_start|>' + message['role'] + '\n' }}{% if message['role'] == 'assistant' %}"
                "{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{% else %}{{ message['content'] + '<|im_end|>' }}{% endif %}"
                "{{ '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
make(["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"], "llama3",
     {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "chat_template": LLAMA3})
make(["<|endoftext|>", "<|im_start|>", "<|im_end|>"], "qwen2",
     {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None,
      "chat_template": QWEN2})
open("llama3_marked.jinja", "w").write(LLAMA3_MARKED)
open("qwen2_marked.jinja", "w").write(QWEN2_MARKED)
PY
for t in llama3 qwen2; do
  "$KILN_BIN" prep --chat --input chat.jsonl --tokenizer $t/tokenizer.json --out $t.shards | tee $t.prep
  grep -Eq "^kiln prep: chat: [0-9]+ of the [0-9]+ tokens are trained on" $t.prep || fail "$t: prep's chat line"
  for f in train_000000.bin train_000000.mask tokenizer.json chat_template.jinja; do [ -f $t.shards/$f ] || fail "$t: no $f"; done
  "$KILN_BIN" train --device cpu --model tiny-llama --data "$t.shards/train_*.bin" --seq-len 64 --micro-batch 4 --steps 30 \
    --log-every 100 --save-dir $t.ckpt --log-json $t.jsonl >/dev/null
  "$KILN_BIN" eval --checkpoint $t.ckpt/step_00000030 --val-data $t.shards/train_000000.bin --eval-batches 0 --micro-batch 4 \
    --log-json $t.eval.jsonl >/dev/null
done
"$KILN_BIN" prep --chat --input chat.jsonl --tokenizer qwen2/tokenizer.json --chat-template qwen2_marked.jinja --out marked.shards >/dev/null
cmp marked.shards/train_000000.bin qwen2.shards/train_000000.bin || fail "the marked Qwen2 template's ids differ"
cmp marked.shards/train_000000.mask qwen2.shards/train_000000.mask || fail "the marked Qwen2 template's mask differs from the prefix rule's"
"$py" - <<'PY'
import json, struct
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast, pipeline
convs = [json.loads(l)["messages"] for l in open("chat.jsonl")]
T = 64
for t, marked, eot_text in (("llama3", "llama3_marked.jinja", "<|begin_of_text|>"), ("qwen2", "qwen2_marked.jinja", "<|endoftext|>")):
    hf = PreTrainedTokenizerFast(tokenizer_file=f"{t}/tokenizer.json", **{k: v for k, v in json.load(open(f"{t}/tokenizer_config.json")).items()
                                                                           if k in ("bos_token", "eos_token", "pad_token") and v})
    hf.chat_template = open(marked).read()
    eot = hf.convert_tokens_to_ids(eot_text)
    ids, mask = [], []
    for msgs in convs:  # transformers' ids and assistant mask, conversation by conversation
        out = hf.apply_chat_template(msgs, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
        i, m = list(out["input_ids"]), list(out["assistant_masks"])
        if i[0] != eot:
            i, m = [eot] + i, [0] + m
        ids += i
        mask += m
    raw = open(f"{t}.shards/train_000000.bin", "rb").read()
    magic, version, count = struct.unpack("<3i", raw[:12])
    width = 2 if version == 1 else 4
    shard = list(struct.unpack(f"<{count}{'H' if width == 2 else 'I'}", raw[1024:]))
    kmask = list(open(f"{t}.shards/train_000000.mask", "rb").read()[1024:])
    assert shard == ids, f"{t}: kiln's ids differ from apply_chat_template's at {next(k for k in range(len(ids)) if k >= len(shard) or shard[k] != ids[k])}"
    assert kmask == mask, f"{t}: kiln's mask differs from transformers' assistant mask at {next(k for k in range(len(mask)) if kmask[k] != mask[k])}"
    trained = sum(mask)
    assert 0.2 * len(mask) < trained < 0.8 * len(mask), (t, trained, len(mask))
    steps = [json.loads(l) for l in open(f"{t}.jsonl") if '"type":"step"' in l]
    assert len(steps) == 30 and all(0 < s["loss_tokens"] < s["tokens"] for s in steps), t
    # kiln eval: the first (samples // 4) * 4 windows of T + 1 tokens, in order (no shuffle).
    samples = (len(ids) - 1) // T
    n = samples // 4 * 4
    windows = torch.tensor([ids[k * T:k * T + T + 1] for k in range(n)])
    keep = torch.tensor([mask[k * T:k * T + T + 1] for k in range(n)]).bool()
    labels = windows.masked_fill(~keep, -100)
    ck = f"{t}.ckpt/step_00000030"
    model = AutoModelForCausalLM.from_pretrained(ck, dtype=torch.float32).eval()
    with torch.no_grad():
        hf_loss = model(input_ids=windows, labels=labels).loss.item()       # shifts the labels itself
        every = model(input_ids=windows, labels=windows).loss.item()
    kiln = [json.loads(l) for l in open(f"{t}.eval.jsonl") if '"type":"eval"' in l][-1]["val_loss"]
    rel = abs(kiln - hf_loss) / hf_loss
    print(f"{t}: kiln eval {kiln:.6f}, transformers with labels -100 on the prompt {hf_loss:.6f} ({rel:.1e}); every target {every:.6f}; "
          f"{trained} of {len(ids)} tokens trained on, {n} windows")
    assert rel <= 1e-5, (t, kiln, hf_loss)
    assert abs(every - kiln) / kiln > 1e-2, (t, every, kiln)
    # The checkpoint carries the template: AutoTokenizer renders the conversations as the data has them.
    tok = AutoTokenizer.from_pretrained(ck)
    cfg = json.load(open(f"{ck}/tokenizer_config.json"))
    assert cfg.get("chat_template") == json.load(open(f"{t}/tokenizer_config.json"))["chat_template"], f"{t}: the checkpoint's template"
    for msgs in convs[:5]:
        want = list(hf.apply_chat_template(msgs, tokenize=True, return_dict=False))
        got = list(tok.apply_chat_template(msgs, tokenize=True, return_dict=False))
        assert got == want, (t, got[:20], want[:20])
    gen = pipeline("text-generation", model=ck)
    out = gen([{"role": "user", "content": "What is the quick fox?"}], max_new_tokens=5, do_sample=False)
    assert out[0]["generated_text"][-1]["role"] == "assistant", out
print("chat data == transformers (ids, masks, loss); checkpoints carry the template")
PY
# Bad input: one line, exit 2.
refuse() {
  local regex=$1; shift
  local code=0
  "$KILN_BIN" prep "$@" >/dev/null 2>err || code=$?
  [ "$code" -eq 2 ] && grep -Eq "kiln: error: .*$regex" err || { cat err >&2; fail "prep $* (want exit 2, '$regex')"; }
  [ "$(grep -c . err)" -eq 1 ] || { cat err >&2; fail "prep $*: more than one line"; }
  echo "refused: $(cat err)"
}
refuse "--chat needs --tokenizer" --chat --input chat.jsonl --out bad1
mkdir bare && cp llama3/tokenizer.json bare/
refuse "no chat template" --chat --input chat.jsonl --tokenizer bare/tokenizer.json --out bad2
echo '{"text": "not a conversation"}' > notchat.jsonl
refuse "notchat.jsonl, line 1: no list field 'messages'" --chat --input notchat.jsonl --tokenizer llama3/tokenizer.json --out bad3
[ ! -e bad2 ] && [ ! -e bad3 ] || fail "a refused prep left its output directory"
echo PASS
