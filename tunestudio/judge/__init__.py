"""A pairwise judge of a job's model against its base or another job (see core.py for the method)."""

from tunestudio.judge.core import (
    Answerer,
    JudgeError,
    Judgement,
    Messages,
    Prompt,
    Row,
    Summary,
    combine,
    judge_row,
    parse_verdict,
    run,
    wilson,
)
from tunestudio.judge.endpoint import Endpoint, JudgeNotConfigured
from tunestudio.judge.prompts import MAX_PROMPTS, PromptsError
from tunestudio.judge.prompts import held_out as held_out_prompts
from tunestudio.judge.prompts import read as read_prompts
from tunestudio.judge.service import FOLDER, JudgementOver, Judgements, UnknownJudgement

__all__ = [
    "FOLDER",
    "MAX_PROMPTS",
    "Answerer",
    "Endpoint",
    "JudgeError",
    "JudgeNotConfigured",
    "Judgement",
    "JudgementOver",
    "Judgements",
    "Messages",
    "Prompt",
    "PromptsError",
    "Row",
    "Summary",
    "UnknownJudgement",
    "combine",
    "held_out_prompts",
    "judge_row",
    "parse_verdict",
    "read_prompts",
    "run",
    "wilson",
]
