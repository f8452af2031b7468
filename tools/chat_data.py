# tools/chat_data.py -- instruction data for `kiln prep --chat`: conversations through the
# tokenizer's own chat template, and which of their tokens are trained on.
#
# A conversation is one JSONL line {"messages": [{"role": ..., "content": ...}, ...]} (the form
# Hugging Face datasets export; --jsonl-field names another field). It is rendered by
# transformers' apply_chat_template with the tokenizer's template -- tokenizer_config.json's
# "chat_template" or chat_template.jinja beside the tokenizer.json, or --chat-template FILE -- and
# the special tokens that config names (bos_token, eos_token: templates print them), then encoded
# by the tokenizers library as kiln prep encodes text (no special tokens added: the template
# writes its own).
#
# Trained-on tokens (mask 1): the assistant's turns, each with the template's end of turn
# (<|eot_id|>, <|im_end|>) -- the model learns to stop. Everything else (system, user, the
# template's headers, the document token) is mask 0.
#   - A template that marks them ({% generation %} ... {% endgeneration %}, transformers'
#     convention) decides itself: apply_chat_template's assistant mask.
#   - Otherwise by prefixes: for the i-th message, an assistant's, the text of messages[:i]
#     rendered with the generation prompt ("...<|im_start|>assistant\n") and the text of
#     messages[:i+1] must both begin the whole conversation's text; the characters between their
#     ends, less trailing whitespace (Qwen2's "\n" after <|im_end|>), are the turn. A token is
#     trained on when its first character lies in a turn (the tokenizers library's offsets). A
#     template for which the prefixes do not hold (one that rewrites earlier turns) is refused.
# Every conversation is a document: end-of-text first unless the template's text opens with it
# (Llama 3's <|begin_of_text|>), as kiln prep opens every document.
import json
import os
import re

GENERATION = re.compile(r"\{%-?\s*generation\s*-?%\}")


def _token_text(value):
    """A special token as tokenizer_config.json gives it: a string, or {"content": ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def chat_tokenizer(tok, tokenizer_path, template_path, die):
    """transformers' fast tokenizer over `tok` with the chat template; returns (it, template)."""
    try:
        from transformers import PreTrainedTokenizerFast
    except ImportError:
        die("kiln prep --chat needs the Python package 'transformers' in KILN_PYTHON's environment "
            "(bash launch/setup.sh installs it): the chat template is applied by its apply_chat_template")
    directory = os.path.dirname(os.path.abspath(tokenizer_path))
    config_path = os.path.join(directory, "tokenizer_config.json")
    config = {}
    if os.path.exists(config_path):
        try:
            with open(config_path, encoding="utf-8") as f:
                config = json.load(f)
        except (OSError, ValueError) as e:
            die(f"prep --chat: {config_path}: cannot read it as JSON ({str(e).splitlines()[0]})")
        if not isinstance(config, dict):
            die(f"prep --chat: {config_path}: not a JSON object")
    template, where = None, None
    jinja = os.path.join(directory, "chat_template.jinja")
    if template_path:
        where = template_path
    elif os.path.exists(jinja):
        where = jinja
    if where:
        try:
            with open(where, encoding="utf-8") as f:
                template = f.read()
        except (OSError, UnicodeDecodeError) as e:
            die(f"prep --chat: {where}: cannot read the chat template ({e})")
    else:
        template, where = config.get("chat_template"), config_path
        if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
            template = next((t.get("template") for t in template if isinstance(t, dict) and t.get("name") == "default"), None)
    if not isinstance(template, str) or not template.strip():
        die(f"prep --chat: no chat template: neither {config_path} (its \"chat_template\") nor {jinja} holds one "
            "beside the tokenizer; give --chat-template FILE (a Jinja template, as transformers' apply_chat_template takes)")
    special = {}
    for key in ("bos_token", "eos_token", "unk_token", "pad_token"):
        text = _token_text(config.get(key))
        if text is not None and tok.token_to_id(text) is not None:
            special[key] = text
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, **special)
    hf.chat_template = template
    return hf, template


def check_messages(rec, field, where, die):
    """The messages of one JSONL record, or one line naming what is wrong."""
    if not isinstance(rec, dict) or not isinstance(rec.get(field), list) or not rec[field]:
        die(f"prep: {where}: no list field '{field}' of messages (a chat line is "
            f'{{"{field}": [{{"role": "user", "content": "..."}}, ...]}}; --jsonl-field NAME for another field)')
    for k, m in enumerate(rec[field]):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            die(f"prep: {where}: message {k} is not {{\"role\": string, \"content\": string}}")
    return rec[field]


def render(hf, messages, where, die, **kw):
    try:
        return hf.apply_chat_template(messages, tokenize=False, **kw)
    except Exception as e:  # the template's own error (jinja's, or raise_exception in the template)
        die(f"prep: {where}: the chat template fails on this conversation ({str(e).splitlines()[0]})")


def conversation(hf, tok, template, messages, eot, where, die):
    """(ids, mask) of one conversation as a document: end-of-text opens it (unless the template's
    text already does), mask 1 on the assistant's tokens."""
    if GENERATION.search(template):
        try:
            out = hf.apply_chat_template(messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
        except Exception as e:
            die(f"prep: {where}: the chat template fails on this conversation ({str(e).splitlines()[0]})")
        ids, mask = list(out["input_ids"]), [int(bool(v)) for v in out["assistant_masks"]]
    else:
        text = render(hf, messages, where, die)
        spans = []
        for i, m in enumerate(messages):
            if m["role"] != "assistant":
                continue
            before = render(hf, messages[:i], where, die, add_generation_prompt=True) if i > 0 else ""
            through = render(hf, messages[:i + 1], where, die)
            end = len(through.rstrip())
            if not (text.startswith(before) and text.startswith(through) and end > len(before)):
                die(f"prep: {where}: message {i}: the chat template's text of the conversation so far does not begin the "
                    "whole conversation's text, so its assistant turns cannot be told apart; give a template that marks "
                    "them with {% generation %} ... {% endgeneration %} (--chat-template FILE)")
            spans.append((len(before), end))
        enc = tok.encode(text, add_special_tokens=False)
        ids = list(enc.ids)
        mask = [int(any(a <= start < b for a, b in spans)) for start, _ in enc.offsets]
    if not ids or ids[0] != eot:
        ids, mask = [eot] + ids, [0] + mask
    return ids, mask
