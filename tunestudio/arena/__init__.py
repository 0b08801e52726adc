"""The arena: blind pairwise votes between models, a leaderboard, and the votes as training data (service.py)."""

from tunestudio.arena.ratings import CHOICES, Vote, bradley_terry, leaderboard
from tunestudio.arena.service import ENDPOINT, EXPORTS, Arena, ArenaInvalid, Params, UnknownBattle, VoteRefused

FILE = "arena.sqlite"  # in the data directory
EXPORT_FOLDER = ("data", "arena")  # the exported datasets, under the data directory (a dataset root)

__all__ = ["CHOICES", "ENDPOINT", "EXPORTS", "EXPORT_FOLDER", "FILE", "Arena", "ArenaInvalid", "Params",
           "UnknownBattle", "Vote", "VoteRefused", "bradley_terry", "leaderboard"]
