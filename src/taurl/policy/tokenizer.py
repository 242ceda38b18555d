"""A byte-level BPE tokenizer trained locally, with a ChatML chat template.

The Hugging Face hub is out of reach, so the policy's tokenizer is trained here on a few
hundred sentences of task text. Its pipeline is *the same as Qwen2's* so that every loader
builds the same ids from the saved files:

=================  ==========================================================================
stage              what
=================  ==========================================================================
normalizer         NFC (canonical composition; ``"Sa\u0303o"`` and ``"São"`` encode alike)
pre-tokenizer      Qwen2's split regex (each digit alone, letters kept with one leading
                   non-letter) then ByteLevel(add_prefix_space=False, use_regex=False)
model              BPE over the 256 byte symbols, trained with ``tokenizers``
decoder            ByteLevel: decode(a + b) == decode(a) + decode(b) when a and b each
                   end on a character boundary
special tokens     ChatML markers and the action tags, so a stop is one token
=================  ==========================================================================

Why mirror Qwen2 instead of a plain ByteLevel pre-tokenizer: with transformers 5,
``AutoTokenizer.from_pretrained`` on a directory whose config says ``qwen2`` builds
``Qwen2Tokenizer`` *whatever* ``tokenizer_class`` the tokenizer config names (qwen2 is in
its "incorrect hub tokenizer class" list), and ``Qwen2Tokenizer`` rebuilds the pipeline above
from vocab and merges alone. A tokenizer trained with another pipeline would load with
silently different ids. With the same pipeline, ``PreTrainedTokenizerFast``,
``Qwen2Tokenizer`` and the raw ``tokenizer.json`` all agree; tests/test_policy.py checks it.
We still pin ``"tokenizer_class": "PreTrainedTokenizerFast"`` for model types that honour it.

The chat template follows Qwen2.5's (Hermes tool calls) with two departures that keep
renderings append-only, which token-exact trajectories need (docs/design.md#token-exact): no default
system prompt is invented, and each ``tool`` message is its own ``user`` turn (Qwen2.5 merges runs
of tool messages into one turn, so adding a second tool result would rewrite the first's end).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from taurl.errors import ConfigError

PAD_TOKEN = "<|endoftext|>"
BOS_TOKEN = "<|endoftext|>"  # never added by encode(); declared so configs have an id for it
IM_START = "<|im_start|>"
EOS_TOKEN = "<|im_end|>"

ACTION_TAGS = (
    "<think>",
    "</think>",
    "<search>",
    "</search>",
    "<information>",
    "</information>",
    "<answer>",
    "</answer>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<action>",  # taurl.envs.gym: one token each, so the stop at </action> is one sampled id
    "</action>",
)
# Order fixes the ids: pad is 0, <|im_start|> 1, <|im_end|> 2, then the tags.
SPECIAL_TOKENS = (PAD_TOKEN, IM_START, EOS_TOKEN, *ACTION_TAGS)

# Qwen2's pre-tokenization regex (transformers/models/qwen2/tokenization_qwen2.py). `\p{N}`
# alone splits every digit, so "1987" is always the same four tokens.
PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"""
    r""" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

DEFAULT_MODEL_MAX_LENGTH = 2048
_N_BYTES = 256
_SCAFFOLD_WEIGHT = 64  # copies of the template text in the training data

# ChatML (Qwen2.5 style, Hermes tool calls). Every line opens with `{%-` / `{{-`, which
# strips the newline before it, so the layout below never reaches the output.
CHAT_TEMPLATE = r"""
{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages and messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- '# Tools\n\nYou may call one or more functions to assist with the user query.\n\n' }}
    {{- 'You are provided with function signatures within <tools></tools> XML tags:\n<tools>' }}
    {%- for tool in tools %}
        {{- '\n' + (tool | tojson) }}
    {%- endfor %}
    {{- '\n</tools>\n\nFor each function call, return a json object with function name and ' }}
    {{- 'arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n' }}
    {{- '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' }}
{%- elif messages and messages[0].role == 'system' %}
    {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'system' and loop.first %}
    {%- elif message.role == 'assistant' and message.tool_calls %}
        {{- '<|im_start|>assistant' }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' + tool_call.name + '", "arguments": ' }}
            {%- if tool_call.arguments is string %}
                {{- tool_call.arguments }}
            {%- else %}
                {{- tool_call.arguments | tojson }}
            {%- endif %}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == 'tool' %}
        {{- '<|im_start|>user\n<tool_response>\n' + message.content }}
        {{- '\n</tool_response><|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>' + message.role + '\n' + (message.content or '') + '<|im_end|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
""".strip()

# The same template with the tools as one-line signatures, ``name(arg: type, ...): description``,
# and no prose preamble: a from-scratch tiny policy learns the call format from its
# demonstrations, and the preamble plus the schema's JSON (~280 tokens of a 1,024-token
# vocabulary for one search tool) would otherwise be 3/4 of every sequence it trains on.
_TOOLS_BLOCK = re.compile(r"\{%- if tools %\}.*?(?=\{%- elif messages)", re.DOTALL)
_COMPACT_TOOLS = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages and messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- '<tools>' }}
    {%- for tool in tools %}
        {%- set f = tool.function if tool.function is defined else tool %}
        {%- set props = f.parameters.properties if f.parameters is defined and f.parameters.properties is defined else {} %}
        {{- '\n' + f.name + '(' }}
        {%- for name, p in props.items() %}
            {{- (', ' if not loop.first else '') + name + ': ' ~ (p.type if p.type is defined else 'any') }}
        {%- endfor %}
        {{- ')' + (': ' + f.description if f.description else '') }}
    {%- endfor %}
    {{- '\n</tools><|im_end|>\n' }}
"""  # noqa: E501 (a chat template's text is saved with every tokenizer: it stays as it is)
CHAT_TEMPLATE_COMPACT = _TOOLS_BLOCK.sub(lambda _: _COMPACT_TOOLS, CHAT_TEMPLATE, count=1)
CHAT_TEMPLATES = {"chatml": CHAT_TEMPLATE, "chatml-compact": CHAT_TEMPLATE_COMPACT}


def _pipeline(model: models.Model) -> Tokenizer:
    """The Qwen2 pipeline around `model` (see the module docstring)."""
    tok = Tokenizer(model)
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    return tok


def build_tokenizer(
    texts: Iterable[str],
    vocab_size: int = 4096,
    *,
    model_max_length: int = DEFAULT_MODEL_MAX_LENGTH,
    min_frequency: int = 2,
    chat_template: str = "chatml",
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on `texts` and wrap it for transformers.

    The vocabulary holds the special tokens (ids 0..len(SPECIAL_TOKENS)-1), the 256 byte
    symbols, then merges up to `vocab_size` (fewer if the texts run out of pairs seen
    `min_frequency` times). Any string encodes, since every byte has a symbol.
    `chat_template`: a name in `CHAT_TEMPLATES` (chatml, chatml-compact).
    """
    floor = len(SPECIAL_TOKENS) + _N_BYTES
    problems = []
    if vocab_size <= floor:
        problems.append(
            f"vocab_size={vocab_size} leaves no room for merges: it must exceed "
            f"{floor} ({len(SPECIAL_TOKENS)} special tokens + {_N_BYTES} bytes); try 4096"
        )
    if chat_template not in CHAT_TEMPLATES:
        problems.append(f"chat_template {chat_template!r} is not one of {sorted(CHAT_TEMPLATES)}")
    if model_max_length < 1:
        problems.append(f"model_max_length={model_max_length} must be positive, e.g. 2048")
    texts = [t for t in texts if t]
    if not texts:
        problems.append("texts is empty: pass the task/corpus sentences to train BPE on")
    if problems:
        raise ConfigError(problems)

    tok = _pipeline(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # The chat scaffolding (role names, the tools preamble) is in every prompt; weighting it
    # in training gives it merges, so a rendered prompt costs words, not bytes.
    scaffold = [_scaffold_text(CHAT_TEMPLATES[chat_template])] * _SCAFFOLD_WEIGHT
    tok.train_from_iterator(_without_special_tokens([*texts, *scaffold]), trainer=trainer)
    return wrap_tokenizer(
        tok, model_max_length=model_max_length, chat_template=CHAT_TEMPLATES[chat_template]
    )


def _without_special_tokens(texts: Iterable[str]) -> Iterable[str]:
    """The text between special tokens: BPE must not learn merges such as "<think" or "><|",
    which encoding (special tokens are matched first) would never produce."""
    split = re.compile("|".join(re.escape(t) for t in SPECIAL_TOKENS))
    for text in texts:
        yield from (piece for piece in split.split(text) if piece)


def _scaffold_text(chat_template: str = CHAT_TEMPLATE) -> str:
    """The fixed text of `chat_template`: a conversation with one short message per role."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    call = {"type": "function", "function": {"name": "name", "arguments": {"query": ""}}}
    messages = [
        {"role": "system", "content": "system"},
        {"role": "user", "content": "user"},
        {"role": "assistant", "content": "assistant", "tool_calls": [call]},
        {"role": "tool", "content": "tool"},
    ]
    template = ImmutableSandboxedEnvironment().from_string(chat_template)
    return template.render(messages=messages, tools=[call], add_generation_prompt=True)


def wrap_tokenizer(
    tok: Tokenizer,
    *,
    model_max_length: int = DEFAULT_MODEL_MAX_LENGTH,
    chat_template: str = CHAT_TEMPLATE,
) -> PreTrainedTokenizerFast:
    """Wrap a raw `tokenizers.Tokenizer` holding SPECIAL_TOKENS as a transformers tokenizer."""
    missing = [t for t in SPECIAL_TOKENS if tok.token_to_id(t) is None]
    if missing:
        raise ConfigError(
            f"the tokenizer lacks special tokens {missing}; build it with build_tokenizer"
        )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD_TOKEN,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=None,
        additional_special_tokens=list(SPECIAL_TOKENS[1:]),
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
        add_prefix_space=False,
        chat_template=chat_template,
    )


def save_tokenizer(tok: PreTrainedTokenizerFast, path: str | Path) -> Path:
    """`save_pretrained` into `path`, pinning the tokenizer class so plain AutoTokenizer loads it.

    Returns the directory. The files are the standard ones (tokenizer.json,
    tokenizer_config.json, chat_template.jinja), loadable with no taurl import.
    """
    path = Path(path)
    tok.save_pretrained(path)
    cfg_path = path / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    # Only the generic class is ours to pin; a model-specific class (Qwen2Tokenizer after a
    # reload from a qwen2 directory, a SentencePiece tokenizer) already names itself right.
    if type(tok) is PreTrainedTokenizerFast:
        cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg["clean_up_tokenization_spaces"] = False
    cfg_path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerFast:
    """Load a tokenizer directory with plain `AutoTokenizer` (any local HF directory works)."""
    from transformers import AutoTokenizer

    path = Path(path)
    if not path.is_dir():
        raise ConfigError(
            f"tokenizer directory {str(path)!r} does not exist; build one with "
            "taurl.policy.build_tokenizer + save_tokenizer, or point to a local HF model directory"
        )
    return AutoTokenizer.from_pretrained(path)
