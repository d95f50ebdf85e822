"""An agent program's requests, recorded as the rows of one rollout: threads, joins,
harness compactions and drift (docs/harnesses.md).

The endpoint (``agentrl.engines.chat_server``) asks a :class:`HarnessSession` for the
prompt ids of each request (:meth:`~HarnessSession.begin`) and hands it what the engine
generated (:meth:`~HarnessSession.finish`). A request goes to a *thread*:

- it **joins** the idle thread whose last prompt + completion its prompt extends: at the
  message level (the earlier messages as sent before, the echoed assistant message
  matching the reply returned for it), or, failing that, when the ids of its rendering
  extend that thread's row exactly. The new ids are only the template's delta after the
  generated tokens (``agentrl.rollout.context``), so the row is exactly what the engine
  saw;
- otherwise, when an idle thread began with the same head (the messages up to the first
  user message: system prompt and task), it starts a **new row** of that thread: a
  *harness compaction* (``rewritten``, ``dropped_messages``, ``retry``,
  ``tools_changed``), or *drift* when the program edited an assistant message the model
  generated (never trained on: the edited text is prompt in the new row);
- otherwise (a concurrent request, or another conversation) it starts a **new thread**.

Assistant messages the program sends back are matched to the ids generated for them
(:func:`agentrl.engines.chat_api.reply_key`: text and calls, not call ids) and rendered
from those ids, never re-tokenized from text.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any, NamedTuple

import msgspec

from agentrl.engines.chat_api import ChatError, ChatRequest, reply_key
from agentrl.engines.interface import Generation, SamplingParams
from agentrl.rollout.chat_style import stop_ids_of
from agentrl.rollout.context import ChatContext
from agentrl.rollout.segment_builder import SegmentBuilder
from agentrl.types import MAIN_THREAD, Segment, Spend, Thread

ERROR_KINDS = {"model_not_found": "harness_foreign_model", "budget_exceeded": "harness_budget",
               "context_length_exceeded": "engine_refused",
               "engine_unavailable": "engine_unavailable"}
"""A refused request's code → the invalid kind of its rollout (others:
``harness_bad_request``)."""


class SessionLimits(msgspec.Struct, frozen=True):
    """What one rollout's program may ask for."""

    max_requests: int
    max_new_tokens: int
    """Per request."""
    max_generated_tokens: int
    """Over the whole session."""


class Reply(NamedTuple):
    """What the model generated for one request, and the message the program got."""

    token_ids: list[int]
    message: dict[str, Any]


class Placement(NamedTuple):
    """Where a request goes, decided in ``begin`` and applied in ``finish``."""

    thread: ThreadState
    prompt_ids: list[int]
    context: ChatContext
    join: Any
    """The Turn appended to the thread's context (message-level join), the new context's
    length to extend to (id-level join), or None (a new row)."""
    boundary: str = ""


class ChatTurn(NamedTuple):
    """One request in flight: the prompt, the sampling settings, where it goes."""

    prompt_ids: list[int]
    params: SamplingParams
    placement: Placement
    request: ChatRequest


class ThreadState:
    """One conversation of the session: its rows and what it last sent and got."""

    def __init__(self, thread_id: str, parent: str = MAIN_THREAD, depth: int = 0,
                 origin: str = "") -> None:
        self.meta = Thread(thread_id, parent=parent, depth=depth, origin=origin)
        self.rows: list[Segment] = []
        self.row: SegmentBuilder | None = None
        self.boundary = ""
        self.context: ChatContext | None = None
        self.sent: list[dict[str, Any]] = []
        """The messages of its last request."""
        self.pending: list[dict[str, Any]] = []
        """The messages of its request in flight."""
        self.reply: Reply | None = None
        self.busy = False

    @property
    def thread_id(self) -> str:
        """Its id (``MAIN_THREAD`` for the first)."""
        return self.meta.thread_id

    def history(self) -> list[dict[str, Any]]:
        """Its last request's messages and the reply it got."""
        return self.sent + ([self.reply.message] if self.reply else [])

    def known(self) -> list[dict[str, Any]]:
        """The messages it holds: the request in flight's, else its history."""
        return self.pending if self.busy else self.history()

    def close_row(self) -> None:
        """Finish the current row (kept when it holds generated tokens)."""
        if self.row is not None and sum(self.row.loss_mask):
            self.rows.append(msgspec.structs.replace(
                self.row.build(), thread=self.thread_id, boundary=self.boundary))
        self.row = None


class HarnessSession:
    """The requests of one rollout's program (see the module doc)."""

    def __init__(self, session_id: str, tokenizer: Any, limits: SessionLimits,
                 sampling: Callable[[int, ChatRequest, int], SamplingParams],
                 versions: Callable[[Generation], list[int]]) -> None:
        """``sampling(request index, request, max_tokens)``: the settings of one request;
        ``versions``: the policy version of each generated token."""
        self.session_id = session_id
        self.tokenizer = tokenizer
        self.limits = limits
        self.sampling = sampling
        self.versions = versions
        self.stop_ids: tuple[int, ...] = stop_ids_of(tokenizer)
        self.threads: list[ThreadState] = []
        self.replies: dict[str, Reply] = {}
        self.num_requests = 0
        """Requests placed (refused ones not counted)."""
        self.num_completions = 0
        """Requests answered with a generation."""
        self.num_generated_tokens = 0
        self.num_reserved_tokens = 0
        """Tokens granted to requests in flight (``max_tokens`` each): concurrent requests
        share what is left of the budget instead of each being granted all of it."""
        self.compactions: Counter[str] = Counter()
        self.num_drift = 0
        self.failure: tuple[str, str] | None = None
        """(invalid kind, message) of the first refused request."""
        self.closed = False
        self.spend = Spend()
        """Its requests' share of the engine's time and their tokens (``engine`` adds)."""
        self.engine: Any = None
        """What serves its requests: set by the endpoint to a metered view of the run's
        engine; None: the server's own."""

    # ------------------------------------------------------------ the endpoint's calls

    def begin(self, request: ChatRequest) -> ChatTurn:
        """The prompt ids and sampling settings of a request; ChatError when it is over
        budget or the session has ended."""
        if self.closed:
            raise ChatError(400, "session_closed", f"session {self.session_id!r} has ended "
                            "(its rollout is over); no further requests are served")
        if self.num_requests >= self.limits.max_requests:
            raise ChatError(400, "budget_exceeded", f"session {self.session_id!r}: "
                            f"{self.limits.max_requests} requests is its budget "
                            "(harness.max_requests, default rollout.max_turns)")
        left = (self.limits.max_generated_tokens - self.num_generated_tokens
                - self.num_reserved_tokens)
        if left < 1:
            raise ChatError(400, "budget_exceeded", f"session {self.session_id!r}: it "
                            f"generated {self.num_generated_tokens} tokens and requests in "
                            f"flight hold {self.num_reserved_tokens} more; "
                            f"{self.limits.max_generated_tokens} is its budget "
                            "(rollout.max_rollout_tokens)")
        if request.max_tokens is not None and request.max_tokens < 1:
            raise ChatError(400, "invalid_parameter", "max_tokens must be >= 1", "max_tokens")
        placement = self._place(request)
        placement.thread.busy, placement.thread.pending = True, request.messages
        max_tokens = min(request.max_tokens or left, self.limits.max_new_tokens, left)
        params = self.sampling(self.num_requests, request, max_tokens)
        self.num_requests += 1
        self.num_reserved_tokens += max_tokens
        return ChatTurn(placement.prompt_ids, params, placement, request)

    def finish(self, turn: ChatTurn, generation: Generation, reply: dict[str, Any]) -> None:
        """Record the generated tokens where ``begin`` placed the request."""
        place = turn.placement
        thread = place.thread
        thread.busy = False
        if place.join is None:  # a new row (or the thread's first)
            thread.close_row()
            thread.row, thread.boundary = SegmentBuilder(place.prompt_ids), place.boundary
            self._count(place.boundary)
        else:
            assert thread.row is not None
            thread.row.add_observation(place.prompt_ids[len(thread.row):])
            if not isinstance(place.join, int):
                place.context.turns.append(place.join)
        thread.context = place.context
        thread.row.add_generated(generation.token_ids, generation.logprobs,
                                 self.versions(generation))
        thread.sent, thread.reply = turn.request.messages, Reply(generation.token_ids, reply)
        self.replies[reply_key(reply)] = thread.reply
        self.num_generated_tokens += len(generation.token_ids)
        self.num_reserved_tokens -= turn.params.max_tokens
        self.num_completions += 1

    def abandon(self, turn: ChatTurn) -> None:
        """The request produced nothing (the client left, the engine failed)."""
        turn.placement.thread.busy = False
        self.num_reserved_tokens -= turn.params.max_tokens

    def refuse(self, error: ChatError) -> None:
        """Remember why a request was refused: the rollout is invalid for that reason."""
        if self.failure is None and error.code != "session_closed":
            self.failure = (ERROR_KINDS.get(error.code, "harness_bad_request"), str(error))

    def close(self) -> None:
        """End the session: later requests are refused; every thread's last row closes."""
        self.closed = True
        for thread in self.threads:
            thread.close_row()

    # ------------------------------------------------------------ results

    def segments(self) -> list[Segment]:
        """Every row of every thread, thread by thread (after :meth:`close`)."""
        return [row for thread in self.threads for row in thread.rows]

    def describe(self) -> dict[str, Any]:
        """How the requests became rows so far (also the row still open)."""
        threads = []
        for thread in self.threads:
            rows = [(r.boundary, len(r.token_ids), r.num_generated_tokens) for r in thread.rows]
            if thread.row is not None:
                rows.append((thread.boundary, len(thread.row), sum(thread.row.loss_mask)))
            threads.append({**msgspec.to_builtins(thread.meta), "rows": [
                {"boundary": b, "num_tokens": n, "num_generated_tokens": g}
                for b, n, g in rows]})
        return {"session": self.session_id, "num_requests": self.num_requests,
                "num_completions": self.num_completions,
                "num_generated_tokens": self.num_generated_tokens,
                "compactions": dict(self.compactions), "num_drift": self.num_drift,
                "failure": None if self.failure is None else list(self.failure),
                "threads": threads}

    def thread_tree(self) -> list[Thread]:
        """The threads besides the main one that produced rows, for ``Rollout.threads``."""
        return [t.meta for t in self.threads[1:] if t.rows]

    # ------------------------------------------------------------ placing a request

    def _place(self, request: ChatRequest) -> Placement:
        messages, tools = request.messages, request.tools
        idle = [t for t in reversed(self.threads) if not t.busy and t.reply is not None]
        for thread in idle:  # the prompt extends what the thread sent and got
            placement = self._message_join(thread, messages, tools)
            if placement is not None:
                return placement
        context, prompt_ids = self._render(messages, tools)
        for thread in idle:  # its rendering extends the thread's row, id for id
            row = thread.row
            if row is not None and len(prompt_ids) > len(row) and (
                    prompt_ids[:len(row)] == row.token_ids):
                return Placement(thread, prompt_ids, context, len(prompt_ids))
        head = _head_length(messages)
        owner = max((t for t in idle if _common(t.history(), messages) >= head),
                    key=lambda t: _common(t.history(), messages), default=None)
        if owner is not None:
            boundary = self._boundary(owner, messages, tools)
            return Placement(owner, prompt_ids, context, None, boundary)
        return Placement(self._new_thread(messages), prompt_ids, context, None)

    def _message_join(self, thread: ThreadState, messages: list[dict[str, Any]],
                      tools: Any) -> Placement | None:
        sent, reply = thread.sent, thread.reply
        assert reply is not None and thread.context is not None and thread.row is not None
        if (len(messages) <= len(sent) or messages[:len(sent)] != sent or tools != _tools(
                thread) or messages[len(sent)].get("role") != "assistant"
                or reply_key(messages[len(sent)]) != reply_key(reply.message)):
            return None
        try:
            turn, delta = thread.context.turn_delta(reply.token_ids, self.stop_ids,
                                                    messages[len(sent) + 1:])
        except ValueError:  # a template that rewrites earlier turns: try the id level
            return None
        return Placement(thread, [*thread.row.token_ids, *delta], thread.context, turn)

    def _render(self, messages: list[dict[str, Any]], tools: Any
                ) -> tuple[ChatContext, list[int]]:
        """The prompt ids of ``messages``: the template's, except that every assistant
        message the model generated in this session is its generated ids."""
        cut = [i for i, m in enumerate(messages) if i > 0 and m.get("role") == "assistant"
               and reply_key(m) in self.replies]
        context = ChatContext(self.tokenizer, tools, messages[:cut[0]] if cut else messages)
        ids = context.prompt_ids()
        for n, index in enumerate(cut):
            generated = self.replies[reply_key(messages[index])].token_ids
            following = messages[index + 1: cut[n + 1] if n + 1 < len(cut) else None]
            try:
                turn, delta = context.turn_delta(generated, self.stop_ids, following)
            except ValueError:  # the template cannot append: plain text, as a prompt
                context = ChatContext(self.tokenizer, tools, messages)
                return context, context.prompt_ids()
            context.turns.append(turn)
            ids += [*generated, *delta]
        return context, ids

    def _boundary(self, thread: ThreadState, messages: list[dict[str, Any]], tools: Any) -> str:
        """Why the request does not extend the thread: drift or a harness compaction."""
        before = thread.history()
        k = _common(before, messages)
        if (k < len(before) and k < len(messages) and before[k]["role"] == "assistant"
                and messages[k].get("role") == "assistant"
                and reply_key(before[k]) in self.replies
                and reply_key(messages[k]) not in self.replies):  # not a reply moved up
            return "drift:edited_assistant"
        if tools != _tools(thread):
            reason = "tools_changed"
        elif k == len(messages):
            reason = "retry"
        elif len(messages) - 1 > _head_length(messages) and _is_subsequence(
                messages[:-1], before):  # later turns kept, earlier ones left out
            reason = "dropped_messages"
        else:
            reason = "rewritten"
        return f"harness_compaction:{reason}"

    def _count(self, boundary: str) -> None:
        if boundary.startswith("harness_compaction:"):
            self.compactions[boundary.partition(":")[2]] += 1
        elif boundary.startswith("drift:"):
            self.num_drift += 1

    def _new_thread(self, messages: list[dict[str, Any]]) -> ThreadState:
        for thread in self.threads:  # one whose only request produced nothing
            if not thread.busy and thread.reply is None:
                return thread
        if not self.threads:
            thread = ThreadState(MAIN_THREAD)
        else:
            parent = max(self.threads, key=lambda t: _common(t.known(), messages))
            concurrent = any(t.busy and t.pending[:1] == messages[:1] for t in self.threads)
            thread = ThreadState(
                f"t{len(self.threads)}", parent=parent.thread_id,
                depth=parent.meta.depth + 1,
                origin=("the endpoint concurrently" if concurrent
                        else "the endpoint with another conversation"))
        self.threads.append(thread)
        return thread


def _head_length(messages: list[dict[str, Any]]) -> int:
    """Messages up to the first user message (system prompt and task): a request that
    keeps them continues that conversation; one that does not is another conversation."""
    for index, message in enumerate(messages):
        if message.get("role") == "user":
            return index + 1
    return 1


def _tools(thread: ThreadState) -> Any:
    return thread.context.tools if thread.context is not None else None


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    if a.get("role") == "assistant" and b.get("role") == "assistant":
        return reply_key(a) == reply_key(b)
    return a == b


def _common(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> int:
    """Length of the common leading run of two message lists."""
    n = 0
    while n < min(len(a), len(b)) and _same(a[n], b[n]):
        n += 1
    return n


def _is_subsequence(short: list[dict[str, Any]], long: list[dict[str, Any]]) -> bool:
    """Whether ``short`` is ``long`` with some messages left out (order kept)."""
    it = iter(long)
    return len(short) < len(long) and all(any(_same(m, n) for n in it) for m in short)
