"""Tiny randomly initialized Qwen3 models and a small domain tokenizer, for tests and the offline CPU demo.

Nothing can be downloaded from a model hub here, and a 151k-way output layer is too costly to train on two CPU
cores, so the local backend trains a byte-level BPE tokenizer on tau2's own domain text (policies, tool schemas,
user scenarios, DB snippets) with Qwen3's special tokens and chat template, and pairs it with a few-layer Qwen3.
The real Qwen3 tokenizer can be paired with a tiny model as well (inference-only tests of exact tokenization).

    tokenizer = train_small_tokenizer(domain_corpus(["airline", "retail", "telecom"]), "out/tok")
    model_dir = build_tiny_qwen3("out/tiny-qwen3", tokenizer)  # then TransformersEngine.from_pretrained(model_dir)
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tau2_rl_pipeline.files import staging_dir

# Qwen3-4B-Instruct-2507's chat template, byte-identical to `chat_template` in that model's tokenizer_config.json
# (Qwen team, Apache-2.0). It is data: the format the policy must learn and the one SGLang renders at scale.
# Tool results render inside a user turn as <tool_response> blocks; there is no thinking mode.
QWEN3_CHAT_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}"""

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# Qwen3 registers its tool markers as added but not "special" tokens: decoding with skip_special_tokens=True keeps
# them, which a tool-call parser reading decoded text relies on. Ours follow suit.
TOOL_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
MIN_VOCAB_SIZE = 256 + len(SPECIAL_TOKENS) + len(TOOL_TOKENS)  # the byte alphabet and the markers
SPEC_FILE = "tiny_model_spec.json"  # what a model directory was built from; equal spec = reuse it
DB_SNIPPET_CHARS = 20_000  # airline's DB is 3 MB of JSON: a slice teaches the tokenizer its ids and field names


def train_small_tokenizer(texts: Iterable[str], out_dir: str | Path, *, vocab_size: int = 2048) -> Any:
    """Train a byte-level BPE tokenizer (at most `vocab_size` ids, the 7 Qwen3 markers included) on `texts`,
    give it Qwen3's chat template (eos <|im_end|>, pad <|endoftext|>), save it to `out_dir` and return it as a
    transformers PreTrainedTokenizerFast. Byte-level means any text still encodes, just in more tokens."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    merged_vocab = vocab_size - len(TOOL_TOKENS)
    if vocab_size < MIN_VOCAB_SIZE:
        raise ValueError(f"vocab_size must be >= {MIN_VOCAB_SIZE} (256 byte tokens + the Qwen3 markers), "
                         f"got {vocab_size}")
    texts = [t for t in texts if t]
    if not texts:
        raise ValueError("no training texts for the tokenizer")
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=merged_vocab, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    backend.train_from_iterator(texts, trainer)
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TOKENS])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                        clean_up_tokenization_spaces=False, model_max_length=32768)
    tokenizer.chat_template = QWEN3_CHAT_TEMPLATE
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(out))
    return tokenizer


def _tokenizer_fingerprint(tokenizer: Any) -> str:
    """Hash of everything about a tokenizer that a saved model directory depends on."""
    digest = hashlib.sha256(tokenizer.backend_tokenizer.to_str().encode("utf-8"))
    digest.update(json.dumps([tokenizer.chat_template, tokenizer.eos_token, tokenizer.pad_token]).encode("utf-8"))
    return digest.hexdigest()


def build_tiny_qwen3(out_dir: str | Path, tokenizer: Any, *, hidden_size: int = 64, num_layers: int = 2,
                     num_heads: int = 4, num_kv_heads: int = 2, intermediate_size: int = 128, seed: int = 0,
                     max_position_embeddings: int = 32768) -> Path:
    """Save a randomly initialized Qwen3ForCausalLM (vocab = len(tokenizer)) with `tokenizer` as a HF model
    directory (safetensors) loadable by AutoModelForCausalLM / AutoTokenizer. A directory already built from the
    same spec is reused; one built from another spec is replaced; any other existing directory is refused."""
    if hidden_size % num_heads or num_heads % num_kv_heads:
        raise ValueError(f"hidden_size ({hidden_size}) must divide by num_heads ({num_heads}), "
                         f"and num_heads by num_kv_heads ({num_kv_heads})")
    out = Path(out_dir)
    spec = {"hidden_size": hidden_size, "num_layers": num_layers, "num_heads": num_heads,
            "num_kv_heads": num_kv_heads, "intermediate_size": intermediate_size, "seed": seed,
            "max_position_embeddings": max_position_embeddings, "vocab_size": len(tokenizer),
            "tokenizer_sha256": _tokenizer_fingerprint(tokenizer)}
    if _built_from(out) == spec:
        return out
    if out.exists() and any(out.iterdir()) and _built_from(out) is None:
        raise FileExistsError(f"{out} exists and was not made by build_tiny_qwen3; refusing to overwrite it")

    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
        head_dim=hidden_size // num_heads, max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,  # as Qwen3-4B; also halves the tiny model's size
        bos_token_id=None, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    with torch.random.fork_rng(devices=[]):  # seed the init without disturbing the caller's RNG
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id

    # Write beside the target, then rename: a reader (or a parallel test worker) never sees half a directory.
    staging = staging_dir(out)
    try:
        model.save_pretrained(str(staging))
        tokenizer.save_pretrained(str(staging))
        (staging / SPEC_FILE).write_text(json.dumps(spec, indent=2, sort_keys=True) + "\n")
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
    except OSError:
        if _built_from(out) != spec:  # lost a race to a worker that built the same thing: theirs is fine
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def _built_from(model_dir: Path) -> dict[str, Any] | None:
    spec_file = model_dir / SPEC_FILE
    if not (spec_file.is_file() and (model_dir / "model.safetensors").is_file()):
        return None
    return json.loads(spec_file.read_text())


def domain_corpus(domains: Iterable[str]) -> list[str]:
    """Tokenizer training text from tau2's own data: policy, tool schemas (JSON), user scenarios, gold tool-call
    arguments in Qwen3's `{"name": ..., "arguments": ...}` form, and a slice of the domain DB as JSON."""
    from tau2.registry import registry

    texts: list[str] = []
    for domain in domains:
        env = registry.get_env_constructor(domain)()
        texts.append(env.get_policy())
        tools = list(env.get_tools()) + (list(env.get_user_tools()) if env.user_tools is not None else [])
        texts.extend(json.dumps(tool.openai_schema) for tool in tools)
        for task in registry.get_tasks_loader(domain)():
            texts.append(str(task.user_scenario))
            actions = task.evaluation_criteria.actions if task.evaluation_criteria else None
            texts.extend(json.dumps({"name": a.name, "arguments": a.arguments}) for a in actions or [])
        texts.append(env.tools.db.model_dump_json()[:DB_SNIPPET_CHARS])
    return texts
