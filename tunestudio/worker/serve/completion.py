"""A text completion (`/v1/completions`): each prompt continued token by token, with log-probabilities.

Prompts are text (tokenised as the tokenizer does by default) or token ids taken as they are, one choice per
prompt. The model runs its own decoding loop here rather than `generate`: one forward pass over the prompt
gives both the echoed prompt's log-probabilities and the first token, and every later token's raw
log-probabilities (the model's distribution before temperature and top-p, as vLLM reports them) are at hand
without asking `generate` for its scores. That is what lm-evaluation-harness's `local-completions` asks for a
loglikelihood: `max_tokens: 1, logprobs: 1, echo: true` over `context + continuation` token ids.

Text reaches the parent as it is made (`ChoiceDelta`), stop strings cut out and text that may begin one held
back, as chat's streamer does; a cancel is read before each token.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import torch

from tunestudio.inference_protocol import ChoiceDelta, Complete, CompletionParams, Done, Started, TokenLogprob
from tunestudio.worker.errors import UserFacing
from tunestudio.worker.serve.generation import Models, context_length, held_back
from tunestudio.worker.serve.prompting import text_tokenizer


def complete(models: Models, request: Complete, replies: Any, halt: threading.Event) -> None:
    """Answer one completion request: Started, each choice's ChoiceDeltas in order, Done (or UserFacing raised
    before Started: a prompt the model cannot take)."""
    params = CompletionParams.model_validate(request.params)
    model, tokenizer, base_off = models.for_spec(request.spec)
    tokenizer = text_tokenizer(tokenizer)  # an image model completes text with its processor's tokenizer
    if torch.get_num_threads() != request.threads:
        torch.set_num_threads(request.threads)
    limit = context_length(model, tokenizer)
    vocabulary = model.get_input_embeddings().weight.shape[0]
    prompts = [_ids(tokenizer, prompt, i, len(request.prompts), vocabulary) for i, prompt in
               enumerate(request.prompts)]
    wanted = params.max_tokens if params.max_tokens is not None else 16
    for i, ids in enumerate(prompts):
        if len(ids) > limit or (len(ids) == limit and wanted > 0):
            where = f"prompt[{i}]" if len(prompts) > 1 else "prompt"
            raise UserFacing(f"{where}: the prompt is {len(ids)} tokens, and the model's context is {limit}",
                             400, "context_length_exceeded", param="prompt")
    rid = request.request_id
    replies.put(Started(rid, sum(len(ids) for ids in prompts), torch.get_num_threads()))
    eos = _eos_ids(model, tokenizer)
    device = next(model.parameters()).device
    reasons: list[str] = []
    made = 0
    adapter_off = model.disable_adapter() if base_off else contextlib.nullcontext()
    with torch.inference_mode(), adapter_off:
        for index, ids in enumerate(prompts):
            echo_text = request.prompts[index] if isinstance(request.prompts[index], str) else None
            choice = _Choice(tokenizer, params, rid, index, replies)
            reason, count = choice.run(model, ids, min(wanted, limit - len(ids)), eos, device, halt, echo_text)
            reasons.append(reason)
            made += count
            if reason == "cancelled":
                break
    final = "cancelled" if "cancelled" in reasons else "length" if "length" in reasons else "stop"
    replies.put(Done(rid, final, sum(len(ids) for ids in prompts), made))  # type: ignore[arg-type]


def _ids(tokenizer: Any, prompt: str | list[int], index: int, count: int, vocabulary: int) -> list[int]:
    where = f"prompt[{index}]" if count > 1 else "prompt"
    if isinstance(prompt, str):
        ids = list(tokenizer(prompt)["input_ids"])
    else:
        ids = list(prompt)
        bad = next((t for t in ids if not 0 <= t < vocabulary), None)
        if bad is not None:
            raise UserFacing(f"{where}: token id {bad} is not in the model's vocabulary (0 to {vocabulary - 1})",
                             400, "invalid_prompt", param="prompt")
    if not ids:
        bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
        if bos is None:
            raise UserFacing(f"{where}: the prompt is empty", 400, "invalid_prompt", param="prompt")
        ids = [bos]  # an empty prompt starts from the model's first token, as OpenAI's did
    return ids


def _eos_ids(model: Any, tokenizer: Any) -> set[int]:
    ids = getattr(model.generation_config, "eos_token_id", None)
    found = set() if ids is None else {ids} if isinstance(ids, int) else set(ids)
    if tokenizer.eos_token_id is not None:
        found.add(tokenizer.eos_token_id)
    return found


class _Choice:
    """One prompt's choice: echo, decode, cut at stops, send as it goes."""

    def __init__(self, tokenizer: Any, params: CompletionParams, rid: int, index: int, replies: Any) -> None:
        self.tokenizer = tokenizer
        self.params = params
        self.rid = rid
        self.index = index
        self.replies = replies
        self.stops = [s for s in params.stop if s]
        self.text = ""  # the choice's text so far (echoed prompt included), stops not cut
        self.sent = 0  # characters of text sent
        self.tokens: list[TokenLogprob] = []  # with logprobs: every token of the choice
        self.tokens_sent = 0
        self._texts: dict[int, str] = {}  # token id → its text alone

    def _text_of(self, token_id: int) -> str:
        if token_id not in self._texts:
            self._texts[token_id] = self.tokenizer.decode([token_id])
        return self._texts[token_id]

    def _record(self, token: str, logprobs: torch.Tensor | None, chosen: int) -> None:
        """One token of the choice; logprobs: the distribution it was drawn from (None: the prompt's first)."""
        if self.params.logprobs is None:
            return
        if logprobs is None:
            self.tokens.append(TokenLogprob(token, None, None, len(self.text)))
            return
        ((mine, top),) = self._scored(logprobs.unsqueeze(0), [chosen])
        self.tokens.append(TokenLogprob(token, mine, top, len(self.text)))

    def _scored(self, logprobs: torch.Tensor, chosen: list[int]) -> list[tuple[float, dict[str, float]]]:
        """Each row's chosen token's log-probability and its top alternatives (text → log-probability, the chosen
        one always among them, as vLLM does), with a few tensor operations for all rows: many small ones are
        slow on a busy CPU."""
        index = torch.tensor(chosen, device=logprobs.device).unsqueeze(1)
        mine = logprobs.gather(1, index).squeeze(1).tolist()
        k = min(self.params.logprobs or 0, logprobs.shape[-1])
        values, ids = torch.topk(logprobs, k, dim=-1) if k else (None, None)
        rows = []
        for row, (value, token) in enumerate(zip(mine, chosen, strict=True)):
            top: dict[str, float] = {}
            if values is not None:
                for alternative, tid in zip(values[row].tolist(), ids[row].tolist(), strict=True):
                    name = self._text_of(tid)
                    top[name] = max(alternative, top.get(name, float("-inf")))
            name = self._text_of(token)
            top[name] = max(value, top.get(name, float("-inf")))
            rows.append((value, top))
        return rows

    def run(self, model: Any, ids: list[int], max_new: int, eos: set[int], device: Any, halt: threading.Event,
            echo_text: str | None) -> tuple[str, int]:
        """Generate up to max_new tokens after ids; (finish reason, tokens made)."""
        out = model(input_ids=torch.tensor([ids], device=device), use_cache=max_new > 1)
        logits = out.logits[0]
        if self.params.echo:
            pieces = [self._text_of(t) for t in ids]
            if self.params.logprobs is not None:
                scored = self._scored(torch.log_softmax(logits[:-1].float(), dim=-1), ids[1:])
                self.tokens.append(TokenLogprob(pieces[0], None, None, 0))
            for position, piece in enumerate(pieces):
                if position and self.params.logprobs is not None:
                    value, top = scored[position - 1]
                    self.tokens.append(TokenLogprob(piece, value, top, len(self.text)))
                self.text += piece
            if echo_text is not None and echo_text != self.text:
                self.text = echo_text  # the prompt as the client wrote it (offsets follow the token pieces)
            self.sent = 0
        start = len(self.text)  # where generated text begins: stops are looked for after it
        past = out.get("cache")  # transformers 5's name for the key/value cache
        following = logits[-1]
        generator = None
        if self.params.temperature > 0 and self.params.seed is not None:
            generator = torch.Generator(device=device).manual_seed(self.params.seed)
        made: list[int] = []
        reason = "length"
        for step in range(max_new):
            if halt.is_set():
                reason = "cancelled"
                break
            logprobs = torch.log_softmax(following.float(), dim=-1)
            token = self._choose(following.float(), generator)
            if token in eos and step >= self.params.min_tokens:
                # As vLLM: the end token is the choice's last token (its log-probability counted, lm_eval's
                # `[ctxlen:-1]` drops it), but not part of the text.
                self._record(self._text_of(token), logprobs, token)
                made.append(token)
                reason = "stop"
                break
            before = self.tokenizer.decode(made, skip_special_tokens=True)
            made.append(token)
            now = self.tokenizer.decode(made, skip_special_tokens=True)
            piece = now[len(before):] if not now.endswith("\ufffd") else self._text_of(token)
            self._record(piece, logprobs, token)
            self.text = self.text[: start] + now if not now.endswith("\ufffd") else self.text + piece
            if self._cut_at_stop(start):
                reason = "stop"
                break
            self._flush(start, final=False)
            if step + 1 < max_new:
                out = model(input_ids=torch.tensor([[token]], device=device), cache=past, use_cache=True)
                past, following = out.get("cache"), out.logits[0, -1]
        self._flush(start, final=True, reason=reason, count=len(made))
        return reason, len(made)

    def _choose(self, logits: torch.Tensor, generator: torch.Generator | None) -> int:
        if self.params.temperature == 0:
            return int(torch.argmax(logits))
        probs = torch.softmax(logits / self.params.temperature, dim=-1)
        if self.params.top_p < 1.0:
            ordered, order = torch.sort(probs, descending=True)
            keep = torch.cumsum(ordered, dim=-1) - ordered < self.params.top_p  # the smallest set reaching top_p
            probs = torch.zeros_like(probs).scatter(0, order[keep], ordered[keep])
        return int(torch.multinomial(probs, 1, generator=generator))

    def _cut_at_stop(self, start: int) -> bool:
        """Cut the text at the first stop string in the generated part; drop the tokens that begin after it."""
        cut = min((found for s in self.stops if (found := self.text.find(s, start)) != -1), default=-1)
        if cut == -1:
            return False
        self.text = self.text[:cut]
        while len(self.tokens) > self.tokens_sent and self.tokens[-1].offset >= cut and self.tokens[-1].offset > start:
            self.tokens.pop()
        return True

    def _flush(self, start: int, final: bool, reason: str | None = None, count: int = 0) -> None:
        upto = len(self.text)
        if not final:
            upto -= held_back(self.text[start:], self.stops)
        if upto <= self.sent and not final:
            return
        tokens = None
        if self.params.logprobs is not None:
            end = len(self.tokens) if final else next(
                (i for i in range(self.tokens_sent, len(self.tokens)) if self.tokens[i].offset >= upto),
                len(self.tokens))
            tokens, self.tokens_sent = self.tokens[self.tokens_sent : end], end
        text = self.text[self.sent : upto] if upto > self.sent else ""
        self.sent = max(self.sent, upto)
        self.replies.put(ChoiceDelta(self.rid, self.index, text, tokens, reason if final else None,  # type: ignore[arg-type]
                                     count if final else 0))
