"""A Hugging Face tokenizer folder read with the ``tokenizers`` library, and its chat template.

``apply_chat_template`` renders the Jinja ``chat_template`` of tokenizer_config.json the
way transformers does (sandboxed environment, trim_blocks/lstrip_blocks, ``tojson``
without HTML escaping, ``raise_exception``, special tokens as variables), so prompts
match what the checkpoint was trained on without importing transformers.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import msgspec
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as RawTokenizer

from agentrl.types import Message

SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "pad_token", "unk_token")
ENCODE_CACHE_TEXTS = 2048
ENCODE_CACHE_CHARS = 16_384
"""``Tokenizer.encode`` remembers up to this many texts of up to this many characters."""


class Tokenizer:
    """Text <-> token ids plus the checkpoint's chat template."""

    def __init__(self, raw: RawTokenizer, config: dict[str, Any]) -> None:
        self.raw = raw
        self.config = config
        self.special_tokens = {k: _token_text(config.get(k)) for k in SPECIAL_TOKEN_KEYS}
        self.chat_template: str | None = _pick_template(config.get("chat_template"))
        self.eos_token_id = self._id_of(self.special_tokens["eos_token"])
        pad = self._id_of(self.special_tokens["pad_token"])
        self.pad_token_id = pad if pad is not None else self.eos_token_id
        self.bos_token_id = self._id_of(self.special_tokens["bos_token"])
        self._encoded: dict[str, tuple[int, ...]] = {}
        """Recent texts and their ids (``encode``)."""
        self.stop_token_ids: tuple[int, ...] = (
            () if self.eos_token_id is None else (self.eos_token_id,))
        """Ids that end a turn: EOS, then the other end-of-turn ids of the checkpoint's
        generation_config.json (Llama 3's <|eom_id|>, gpt-oss's <|call|>)."""

    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included."""
        return self.raw.get_vocab_size(with_added_tokens=True)

    def _id_of(self, token: str | None) -> int | None:
        return None if token is None else self.raw.token_to_id(token)

    def token_to_id(self, token: str) -> int | None:
        """The id of one token string, or None when it is not in the vocabulary."""
        return self.raw.token_to_id(token)

    def encode(self, text: str) -> list[int]:
        """Token ids of text; no BOS/EOS is added (templates already carry them). Texts
        seen lately are not encoded again: a group's rollouts render the same prompt."""
        ids = self._encoded.get(text)
        if ids is None:
            ids = tuple(self.raw.encode(text, add_special_tokens=False).ids)
            if len(text) <= ENCODE_CACHE_CHARS:
                if len(self._encoded) >= ENCODE_CACHE_TEXTS:
                    self._encoded.clear()
                self._encoded[text] = ids
        return list(ids)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """Text of token ids."""
        return self.raw.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(
        self,
        messages: Iterable[Message | dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = False,
        **kwargs: Any,
    ) -> str:
        """The prompt text for messages (and tool schemas), rendered as transformers does."""
        if not self.chat_template:
            raise ValueError(
                "tokenizer_config.json has no chat_template; use an instruct checkpoint or "
                "add a chat_template to tokenizer_config.json"
            )
        template = compile_template(self.chat_template)
        return template.render(
            messages=[message_to_dict(m) for m in messages],
            tools=tools,
            documents=None,
            add_generation_prompt=add_generation_prompt,
            **{k: v for k, v in self.special_tokens.items() if v is not None},
            **kwargs,
        )


def message_to_dict(message: Message | dict[str, Any]) -> dict[str, Any]:
    """A template-ready dict; None fields are dropped, so templates see them undefined."""
    if isinstance(message, dict):
        return message
    raw = msgspec.structs.asdict(message)
    return {k: v for k, v in raw.items() if v is not None}


def load_tokenizer(path: str | Path) -> Tokenizer:
    """The tokenizer of a local HF folder: tokenizer.json + tokenizer_config.json."""
    path = Path(path)
    file = path / "tokenizer.json"
    if not file.is_file():
        raise ValueError(
            f"{file} does not exist; agentrl reads fast tokenizers (tokenizer.json). Save the "
            "tokenizer with transformers' save_pretrained to create it."
        )
    config_file = path / "tokenizer_config.json"
    config = json.loads(config_file.read_text()) if config_file.is_file() else {}
    template_file = path / "chat_template.jinja"
    if "chat_template" not in config and template_file.is_file():
        config["chat_template"] = template_file.read_text()
    tokenizer = Tokenizer(RawTokenizer.from_file(str(file)), config)
    tokenizer.stop_token_ids = _stop_ids(tokenizer, path / "generation_config.json")
    return tokenizer


def _stop_ids(tokenizer: Tokenizer, file: Path) -> tuple[int, ...]:
    """EOS first, then the generation config's other ``eos_token_id`` values."""
    extra: Any = json.loads(file.read_text()).get("eos_token_id") if file.is_file() else None
    extra = extra if isinstance(extra, list) else [extra]
    ids = [*tokenizer.stop_token_ids, *(i for i in extra if isinstance(i, int))]
    return tuple(dict.fromkeys(ids))


def _token_text(value: Any) -> str | None:
    """A special token as written in tokenizer_config.json: a string or an AddedToken dict."""
    if isinstance(value, dict):
        return value.get("content")
    return value


def _pick_template(value: Any) -> str | None:
    """The default template; tokenizer_config.json may hold a list of named templates."""
    if isinstance(value, list):
        named = {t["name"]: t["template"] for t in value}
        return named.get("default")
    return value


class _GenerationTag(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}``: renders its body (HF marks assistant
    spans with it; we need no span tracking)."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller: Any) -> str:
        return caller()


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    # Jinja's own tojson HTML-escapes; chat templates need plain JSON.
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


@lru_cache(maxsize=16)
def compile_template(source: str) -> jinja2.Template:
    """Compile a chat template in the environment transformers uses."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationTag, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)
