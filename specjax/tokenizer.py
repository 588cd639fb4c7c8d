"""Text <-> token ids, and chat prompts, for the models specjax loads.

`Tokenizer` wraps a `tokenizers.Tokenizer` with the few facts generation needs: the EOS id, the
ids that end a chat turn, and the model's Jinja chat template. It is built from a `tokenizer.json`
directory (Hugging Face layout, which `save` also writes) or straight from a GGUF file's
`tokenizer.ggml.*` metadata (byte-level BPE only).

In chat prompts (`encode_chat`) message contents are user text: a special-token string typed there
(e.g. `<|im_end|>`) is encoded as ordinary text, so it cannot end a turn or forge a role, unless the
caller opts in with `parse_special=True`; the template's own special tokens are always control
tokens.
"""

from __future__ import annotations

import functools
import json
import os
import re
import uuid
from collections.abc import Sequence
from typing import Any

import tokenizers
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors

# Tokens that end an assistant turn in common chat formats; each one present joins `stop_ids`.
END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<end_of_turn>")

# llama.cpp token types (`tokenizer.ggml.token_type`).
_CONTROL, _USER_DEFINED = 3, 4

# Pre-tokenizers of byte-level BPE vocabularies, keyed by llama.cpp's `tokenizer.ggml.pre` name.
_QWEN2_SPLIT = (
  r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
  r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_LLAMA3_SPLIT = (
  r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
  r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _byte_level() -> pre_tokenizers.PreTokenizer:
  return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _regex_then_bytes(pattern: str) -> pre_tokenizers.PreTokenizer:
  return pre_tokenizers.Sequence(
    [
      pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
      pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ]
  )


def _pre_tokenizer(pre: str | None) -> pre_tokenizers.PreTokenizer:
  """The pre-tokenizer for llama.cpp's `tokenizer.ggml.pre` name."""
  if pre in (None, "default", "gpt2", "gpt-2"):
    return _byte_level()
  if pre == "smollm":  # every digit on its own, then GPT-2's byte-level split
    return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), _byte_level()])
  if pre in ("qwen2", "deepseek-r1-qwen"):
    return _regex_then_bytes(_QWEN2_SPLIT)
  if pre in ("llama3", "llama-v3", "llama-bpe"):
    return _regex_then_bytes(_LLAMA3_SPLIT)
  raise ValueError(
    f"unsupported GGUF pre-tokenizer {pre!r}; supported: default, gpt2, smollm, qwen2, llama-bpe"
  )


def _raise_exception(message: str):
  """The `raise_exception` that chat templates call on invalid conversations."""
  from jinja2.exceptions import TemplateError

  raise TemplateError(message)


@functools.lru_cache(maxsize=8)
def _compiled(template: str):
  """A chat template compiled once in a sandboxed Jinja environment (templates come from model
  files): compiling costs ~20 renders, and corpus builds and tests render thousands of prompts."""
  from jinja2.sandbox import ImmutableSandboxedEnvironment

  env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
  env.globals["raise_exception"] = _raise_exception
  return env.from_string(template)


def _render(template: str, **context: Any) -> str:
  """Renders a chat template (compiled once per template string)."""
  from jinja2.exceptions import TemplateError

  try:
    return _compiled(template).render(**context)
  except TemplateError as e:
    raise ValueError(f"chat template error: {e}") from e


class Tokenizer:
  """A tokenizer plus the special ids and chat template generation needs.

  Attributes:
    eos_id: the end-of-sequence id (None if the model defines none).
    bos_id: the beginning-of-sequence id (None if none).
    chat_template: the Jinja chat template, or None.
  """

  def __init__(
    self,
    tok: tokenizers.Tokenizer,
    *,
    eos_id: int | None,
    bos_id: int | None = None,
    chat_template: str | None = None,
    add_bos: bool = False,
  ):
    self._tok = tok
    self.eos_id = eos_id
    self.bos_id = bos_id
    self.chat_template = chat_template
    self.add_bos = add_bos

  # ---- construction ----------------------------------------------------------------------------

  @classmethod
  def from_file(
    cls, path: str, *, eos_token: str | None = None, chat_template: str | None = None
  ) -> Tokenizer:
    """Loads a `tokenizer.json`; `eos_token` names the EOS token (default: none)."""
    tok = tokenizers.Tokenizer.from_file(path)
    eos_id = tok.token_to_id(eos_token) if eos_token else None
    if eos_token and eos_id is None:
      raise ValueError(f"EOS token {eos_token!r} is not in the vocabulary of {path}")
    return cls(tok, eos_id=eos_id, chat_template=chat_template)

  @classmethod
  def from_dir(cls, directory: str) -> Tokenizer:
    """Loads `tokenizer.json` + `tokenizer_config.json` (+ `chat_template.jinja`) from a directory.

    This reads both what `save` writes and Hugging Face model directories.
    """
    path = os.path.join(directory, "tokenizer.json")
    if not os.path.exists(path):
      raise FileNotFoundError(f"no tokenizer.json in {directory}")
    tok = tokenizers.Tokenizer.from_file(path)
    conf: dict[str, Any] = {}
    conf_path = os.path.join(directory, "tokenizer_config.json")
    if os.path.exists(conf_path):
      with open(conf_path) as f:
        conf = json.load(f)
    template = conf.get("chat_template")
    jinja_path = os.path.join(directory, "chat_template.jinja")
    if template is None and os.path.exists(jinja_path):
      with open(jinja_path) as f:
        template = f.read()

    def token_id(key: str) -> int | None:
      token = conf.get(key)
      if isinstance(token, dict):
        token = token.get("content")
      if token is None:
        return None
      found = tok.token_to_id(token)
      if found is None:
        raise ValueError(f"{key} {token!r} of {conf_path} is not in the vocabulary")
      return found

    return cls(
      tok,
      eos_id=token_id("eos_token"),
      bos_id=token_id("bos_token"),
      chat_template=template,
      add_bos=bool(conf.get("add_bos_token", False)),
    )

  @classmethod
  def from_gguf(cls, path: str) -> Tokenizer:
    """Builds the byte-level BPE a GGUF file describes in its `tokenizer.ggml.*` metadata.

    Control tokens (token type 3) become special tokens and user-defined ones (type 4) added
    tokens, so both are matched whole in text. Only `tokenizer.ggml.model == "gpt2"` is supported.
    """
    import gguf

    reader = gguf.GGUFReader(path)

    def meta(key, default=None):  # as `specjax.loading.gguf_file.read_metadata`, one layer down
      field = reader.fields.get(f"tokenizer.{key}")
      return default if field is None else field.contents()

    kind = meta("ggml.model")
    if kind != "gpt2":
      raise ValueError(
        f"{path}: only byte-level BPE ('gpt2') GGUF tokenizers are supported, not {kind!r}"
      )
    tokens: list[str] = meta("ggml.tokens")
    merges = []
    for m in meta("ggml.merges", []):
      pair = m.split(" ")
      if len(pair) != 2:
        raise ValueError(f"{path}: malformed merge {m!r}")
      merges.append(tuple(pair))
    types = meta("ggml.token_type") or [1] * len(tokens)

    tok = tokenizers.Tokenizer(
      models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges)
    )
    tok.pre_tokenizer = _pre_tokenizer(meta("ggml.pre"))
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(
      [
        AddedToken(t, special=True, normalized=False)
        for t, k in zip(tokens, types)
        if k == _CONTROL
      ]
    )
    tok.add_tokens(
      [
        AddedToken(t, special=False, normalized=False)
        for t, k in zip(tokens, types)
        if k == _USER_DEFINED
      ]
    )
    bos_id = meta("ggml.bos_token_id")
    add_bos = bool(meta("ggml.add_bos_token", False))
    if add_bos and bos_id is not None:
      bos = tokens[bos_id]
      tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)]
      )
    return cls(
      tok,
      eos_id=meta("ggml.eos_token_id"),
      bos_id=bos_id,
      chat_template=meta("chat_template"),
      add_bos=add_bos,
    )

  def save(self, directory: str) -> None:
    """Writes `tokenizer.json` and a Hugging Face style `tokenizer_config.json` to `directory`."""
    os.makedirs(directory, exist_ok=True)
    self._tok.save(os.path.join(directory, "tokenizer.json"))
    conf: dict[str, Any] = {
      "tokenizer_class": "PreTrainedTokenizerFast",
      "add_bos_token": self.add_bos,
      "bos_token": self.id_to_token(self.bos_id),
      "eos_token": self.id_to_token(self.eos_id),
      "chat_template": self.chat_template,
    }
    with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
      json.dump(conf, f, indent=2)

  # ---- use ---------------------------------------------------------------------------------------

  @property
  def vocab_size(self) -> int:
    return self._tok.get_vocab_size(with_added_tokens=True)

  @property
  def backend(self) -> tokenizers.Tokenizer:
    """The wrapped `tokenizers.Tokenizer`."""
    return self._tok

  def token_to_id(self, token: str) -> int | None:
    return self._tok.token_to_id(token)

  def id_to_token(self, token_id: int | None) -> str | None:
    return None if token_id is None else self._tok.id_to_token(token_id)

  @property
  def stop_ids(self) -> tuple[int, ...]:
    """Ids that end generation: EOS and any end-of-turn token of the chat format."""
    ids = {self.eos_id} if self.eos_id is not None else set()
    ids |= {i for i in map(self._tok.token_to_id, END_OF_TURN_TOKENS) if i is not None}
    return tuple(sorted(ids))

  def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
    """Token ids of `text`; special tokens written in the text (e.g. `<|im_start|>`) stay whole."""
    return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

  def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = True) -> list[list[int]]:
    return [
      e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=add_special_tokens)
    ]

  def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
    return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

  def apply_chat_template(
    self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True
  ) -> str:
    """Renders `messages` ([{"role": ..., "content": ...}]) with the model's chat template."""
    if self.chat_template is None:
      raise ValueError("this tokenizer has no chat template")
    return _render(
      self.chat_template,
      messages=list(messages),
      add_generation_prompt=add_generation_prompt,
      bos_token=self.id_to_token(self.bos_id) or "",
      eos_token=self.id_to_token(self.eos_id) or "",
    )

  def encode_chat(
    self,
    messages: Sequence[dict[str, str]],
    add_generation_prompt: bool = True,
    parse_special: bool = False,
  ) -> list[int]:
    """Token ids of the rendered chat prompt (the template writes any BOS itself).

    Args:
      messages: [{"role": ..., "content": ...}].
      add_generation_prompt: end with the template's assistant header.
      parse_special: also turn special-token strings inside message contents (e.g. a typed
        `<|im_end|>`) into control tokens. Off by default: contents are encoded as plain text,
        which keeps a user from ending a turn or forging a role (chat-template injection).

    Raises:
      ValueError: if a content holds a special-token string, `parse_special` is off, and the
        template rewrites contents (so they cannot be located in the rendered prompt).
    """
    text = self.apply_chat_template(messages, add_generation_prompt)
    if parse_special or not any(self._special_in(m.get("content")) for m in messages):
      return self.encode(text, False)  # nothing to escape: the plain encoding is already safe
    return self._encode_contents_as_text(messages, add_generation_prompt, text)

  def _special_in(self, content: Any) -> bool:
    if not isinstance(content, str):
      return False
    added = self._tok.get_added_tokens_decoder().values()
    return any(t.special and t.content in content for t in added)

  def _encode_contents_as_text(self, messages, add_generation_prompt, text) -> list[int]:
    """Encodes the template's text with special tokens and each content without them."""
    marks = [f"\x00{uuid.uuid4().hex}\x00" for _ in messages]
    marked = [{**m, "content": mark} for m, mark in zip(messages, marks)]
    pieces = re.split(
      "(" + "|".join(marks) + ")", self.apply_chat_template(marked, add_generation_prompt)
    )
    content_of = {mark: m["content"] for mark, m in zip(marks, messages)}
    if "".join(content_of.get(p, p) for p in pieces) != text:
      raise ValueError(
        "a message holds a special-token string and this chat template rewrites message "
        "contents, so it cannot be encoded as text; remove it or pass parse_special=True"
      )
    ids: list[int] = []
    for piece in pieces:
      if piece in content_of:
        before, self._tok.encode_special_tokens = self._tok.encode_special_tokens, True
        try:  # special-token strings in the content become ordinary text
          ids += self.encode(content_of[piece], False)
        finally:
          self._tok.encode_special_tokens = before
      elif piece:
        ids += self.encode(piece, False)
    return ids
