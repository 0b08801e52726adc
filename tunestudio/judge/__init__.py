"""A pairwise judge of a job's model against its base or another job (see core.py for the method)."""

from tunestudio.judge.core import JudgeError, Judgement, Row, Summary, combine, parse_verdict, run, wilson
from tunestudio.judge.endpoint import Endpoint, JudgeNotConfigured
from tunestudio.judge.prompts import PromptsError
from tunestudio.judge.service import JudgementOver, Judgements, UnknownJudgement

__all__ = ["Endpoint", "JudgeError", "JudgeNotConfigured", "Judgement", "JudgementOver", "Judgements",
           "PromptsError", "Row", "Summary", "UnknownJudgement", "combine", "parse_verdict", "run", "wilson"]
