"""Evaluation metrics, computed by hand on a made-up set, and the held-out rows they are computed on."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tunestudio.events import Evaluation
from tunestudio.worker.train.evaluation import Evaluator, eval_rows, score
from tunestudio.worker.train.text_scores import exact_match, normalise, rouge_l, token_f1


def test_exact_match_ignores_case_and_whitespace_only() -> None:
    assert normalise("  Tiger\n\tTIGER  tiger ") == "tiger tiger tiger"
    assert exact_match("Tiger  tiger\ntiger", "tiger tiger tiger") == 1.0
    assert exact_match("tiger tiger", "tiger tiger tiger") == 0.0
    assert exact_match("tiger-tiger", "tiger tiger") == 0.0  # punctuation counts


def test_token_f1_by_hand() -> None:
    # prediction "the cat sat" vs reference "the cat sat on the mat": 3 shared tokens,
    # precision 3/3, recall 3/6, F1 = 2 * 1 * 0.5 / 1.5 = 2/3.
    assert token_f1("The cat sat", "the cat sat on the mat") == pytest.approx(2 / 3)
    # Tokens count as a multiset: "the the the" shares only two "the" with "the cat the".
    assert token_f1("the the the", "the cat the") == pytest.approx(2 * (2 / 3) * (2 / 3) / (4 / 3))
    assert token_f1("dog", "cat") == 0.0
    assert token_f1("", "") == 1.0 and token_f1("", "cat") == 0.0


def test_rouge_l_by_hand() -> None:
    # LCS of "the cat on the mat" and "the cat sat on the mat" is 5 tokens:
    # precision 5/5, recall 5/6, F = 2 * 1 * 5/6 / (1 + 5/6) = 10/11.
    assert rouge_l("the cat on the mat", "the cat sat on the mat") == pytest.approx(10 / 11)
    # Word order matters (token F1 would say 1.0): LCS of "c b a" and "a b c" is 1 token, F = 1/3.
    assert rouge_l("c b a", "a b c") == pytest.approx(1 / 3)
    assert token_f1("c b a", "a b c") == 1.0


def test_score_is_the_mean_over_rows() -> None:
    predictions = ["tiger tiger tiger", "the cat sat", "dog"]
    references = ["Tiger tiger tiger", "the cat sat on the mat", "cat"]
    got = score(predictions, references)
    assert got["exact_match"] == pytest.approx(1 / 3)
    assert got["token_f1"] == pytest.approx((1 + 2 / 3 + 0) / 3)
    # ROUGE-L of row 2: LCS 3, precision 1, recall 1/2 -> 2/3.
    assert got["rouge_l"] == pytest.approx((1 + 2 / 3 + 0) / 3)
    assert score([], []) == {}


def test_eval_rows_from_each_dataset_shape() -> None:
    user = {"role": "user", "content": "Repeat the word three times.\n\ncat"}
    examples = [
        {"prompt": [user], "completion": [{"role": "assistant", "content": "cat cat cat"}]},
        {"messages": [{"role": "system", "content": "be brief"}, user, {"role": "assistant", "content": "cat cat cat"},
                      {"role": "user", "content": "again"}, {"role": "assistant", "content": "cat"}]},
        {"prompt": "Say hi\n", "completion": "hi"},
        {"text": "plain text has no reference"},
        {"messages": [{"role": "assistant", "content": "no prompt before it"}]},
        {"prompt": [user], "chosen": [{"role": "assistant", "content": "cat cat cat"}],
         "rejected": [{"role": "assistant", "content": "dog"}]},
    ]
    rows = eval_rows(examples, limit=10)
    assert [(r.shown, r.reference) for r in rows] == [
        (user["content"], "cat cat cat"), ("again", "cat"), ("Say hi\n", "hi"), (user["content"], "cat cat cat")]
    assert len(rows[1].prompt) == 4  # the conversation up to the last assistant turn
    assert len(eval_rows(examples, limit=2)) == 2


def test_evaluation_record_holds_before_after_and_perplexity(monkeypatch: pytest.MonkeyPatch) -> None:
    import tunestudio.worker.train.evaluation as module

    # The answers are given, not generated: the arithmetic of the record is what is checked here.
    monkeypatch.setattr(module, "generate_answers", lambda *args, **kwargs: ["a b", "c"])
    evaluator = Evaluator(eval_rows([{"prompt": "p", "completion": "a b"}, {"prompt": "q", "completion": "c"}], 5))
    evaluator.before, evaluator.loss_before = ["x", "c"], 2.0
    result = evaluator.result(model=None, tokenizer=None, loss_after=1.0)
    assert isinstance(result, Evaluation) and result.rows == 2
    assert (result.metrics["exact_match"].before, result.metrics["exact_match"].after) == (0.5, 1.0)
    assert result.metrics["perplexity"].before == pytest.approx(math.e ** 2)
    assert result.metrics["eval_loss"].after == 1.0
    assert [(e.prompt, e.reference, e.before, e.after) for e in result.examples] == [
        ("p", "a b", "x", "a b"), ("q", "c", "c", "c")]


def test_row_losses_are_each_rows_reference_cross_entropy_under_the_full_logits(tiny_model: Path) -> None:
    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tunestudio.worker.train.evaluation import EvalRow, row_losses, row_tokens

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    rows = [EvalRow("What comes after one?", " two"),
            EvalRow([{"role": "user", "content": "Say cat"}], "cat"),
            EvalRow(None, "a plain text row, every token of it scored"),
            *(EvalRow("Count to " + "ten, " * n, " ".join(["one"] * (n + 1))) for n in range(8))]
    losses = row_losses(model, tokenizer, rows, max_length=128)  # two left-padded batches of rows of many lengths
    assert losses is not None and len(losses) == 11
    for row, loss in zip(rows, losses, strict=True):
        prompt, reference = row_tokens(tokenizer, row)
        assert reference and reference[-1] == tokenizer.eos_token_id
        if row.prompt is not None:
            assert row.reference.strip() in tokenizer.decode(reference)
        ids = torch.tensor(prompt + reference)
        first = max(len(prompt), 1)
        with torch.no_grad():
            logits = model(input_ids=ids[None]).logits[0]  # every position, no logits_to_keep
        expected = F.cross_entropy(logits[first - 1 : -1].float(), ids[first:]).item()
        assert loss == pytest.approx(expected, rel=1e-5)
    # cut to max_length as training cuts: a row with no reference token left has no loss
    prompt, _ = row_tokens(tokenizer, rows[0])
    assert row_losses(model, tokenizer, rows[:1], max_length=len(prompt)) == [None]


WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def _tool_examples() -> list[dict]:
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    asked = {"role": "user", "content": "What is the weather in Paris?"}
    return [{"messages": [asked, {"role": "assistant", "tool_calls": [call]}], "tools": [WEATHER]},
            {"messages": [{"role": "user", "content": "What colour is it?\n\nlemon"},
                          {"role": "assistant", "content": "yellow"}], "tools": [WEATHER]},
            {"messages": [asked, {"role": "assistant", "tool_calls": [call]},
                          {"role": "tool", "tool_call_id": "c1", "content": '{"sky": "sunny"}'},
                          {"role": "assistant", "content": "It is sunny."}], "tools": [WEATHER]},
            {"prompt": "p", "completion": "a b"}]


def test_tool_rows_are_scored_call_by_call(tiny_model: Path, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from transformers import AutoTokenizer

    import tunestudio.worker.train.evaluation as module
    from tunestudio.worker.tiny import CHAT_TEMPLATE

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    tokenizer.chat_template = CHAT_TEMPLATE  # the template that renders tools (models/ may hold an older build)
    # the answers are given: the base model answers everything, the result calls where it should (one wrong city)
    before = ["sunny", "yellow", "It is sunny.", "a b"]
    after = [CALL.replace("Paris", "Rome"), CALL, "It is sunny.", "a b"]
    answers = iter([before, after])
    monkeypatch.setattr(module, "generate_answers", lambda *args, **kwargs: next(answers))
    monkeypatch.setattr(module, "row_losses", lambda model, tok, rows, *args, **kwargs: [1.0] * len(rows))
    evaluator = Evaluator.for_job(_tool_examples(), limit=8)
    assert evaluator is not None and evaluator.answer_before(None, tokenizer, 2.0)
    assert evaluator.rows[0].reference == CALL  # a call's reference reads as the template writes it
    result = evaluator.result(None, tokenizer, 1.0, rows_file=tmp_path / "rows.json")
    metrics = {name: (m.before, m.after) for name, m in result.metrics.items()}
    # 3 tool rows choose (a call, an answer, an answer); one row calls, its function right, its city wrong
    assert metrics["tool_choice"] == (pytest.approx(2 / 3), pytest.approx(2 / 3))
    assert metrics["tool_name"] == (0.0, 1.0) and metrics["tool_args"] == (0.0, 0.0)
    assert metrics["tool_arg_match"] == (0.0, 0.0)
    body = json.loads((tmp_path / "rows.json").read_text())
    assert body["metrics"] == ["exact_match", "token_f1", "rouge_l", "tool_choice", "tool_name", "tool_args",
                               "tool_arg_match"]
    first, plain = body["rows"][0], body["rows"][3]
    assert (first["tool_choice"], first["tool_name"], first["tool_args"]) == (1.0, 1.0, 0.0)
    assert (first["tool_choice_before"], first["tool_name_before"]) == (0.0, 0.0)
    assert body["rows"][1]["tool_choice"] == 0.0 and body["rows"][1]["tool_name"] is None
    assert "tool_choice" not in plain  # a row without tools has no call figures
    # a row without tools keeps its evaluation as before: no call figures in a job without tool rows
    plain_only = Evaluator.for_job(_tool_examples()[3:], limit=8)
    answers = iter([["a b"], ["a b"]])
    assert plain_only is not None and plain_only.answer_before(None, tokenizer, 2.0)
    assert "tool_choice" not in plain_only.result(None, tokenizer, 1.0).metrics


def test_a_tool_rows_loss_is_taken_on_its_calls_with_its_tools_in_the_prompt(tiny_model: Path) -> None:
    from transformers import AutoTokenizer

    from tunestudio.worker.tiny import CHAT_TEMPLATE
    from tunestudio.worker.train.evaluation import row_tokens

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    tokenizer.chat_template = CHAT_TEMPLATE
    rows = eval_rows(_tool_examples(), limit=8)
    prompt, reference = row_tokens(tokenizer, rows[0])
    assert "<tools>" in tokenizer.decode(prompt) and tokenizer.decode(reference) == CALL + "<|end|>"
    prompt, reference = row_tokens(tokenizer, rows[2])  # the whole loop: the call and the result are the prompt
    assert "<tool_response>" in tokenizer.decode(prompt) and tokenizer.decode(reference) == "It is sunny.<|end|>"
