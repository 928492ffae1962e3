"""The settings of the tiny LM's recipe (:class:`Recipe`: ``generator.*`` of conf/generator/tiny.yaml; the
defaults are the shipped checkpoint's) and the layouts of its later stages. Apart from
:mod:`rag_lab.train.tiny.recipe` so that the stages (:mod:`rag_lab.train.tiny.later`) read them without an
import cycle.
"""

from collections.abc import Sequence
from dataclasses import dataclass

from rag_lab.core.ranges import NonNegative, NonNegativeInt, Positive, PositiveInt, Probability
from rag_lab.env.teacher.generalist import Habits
from rag_lab.train.tiny.model import TinySizes

TUNE_LAYOUT = (
    "demos:stoprag_query",
    "demos:stoprag_query",
    "demos:stoprag_final",
    "demos:stoprag_final",
    "stoprag_intermediate",
    "qa",
    "demos:dapo",
    "demos:evorag",
    "demos:r3rag",
    "demos:apex_plan",
    "demos:apex_exec",
    "demos:apex_final",
)
# The chain stage's layouts (issue 48: experiments/results/tiny_lm.md, "On a GPU"): the teacher's
# chain-of-thought over gold passages (demos:cot) beside the reading layouts, so that reading is kept, and
# every method loop's demonstrations, so that learning to chain does not unlearn the loops (with reading
# layouts alone beside cot, APEX's loop lost 5.6 Acc and EVO-RAG's 4.2).
CHAIN_LAYOUT = tuple(
    "demos:cot demos:cot demos:cot qa qa stoprag_intermediate demos:stoprag_query demos:stoprag_final"
    " demos:dapo demos:evorag demos:r3rag demos:apex_plan demos:apex_exec demos:apex_final".split()
)
# The generalist stage's layouts (issue 64): the chain stage's mix, every demos pool the generalist's
# (rag_lab/env/teacher/generalist.py: the world teacher's reading, a general model's searching and
# planning), cot beside it the world teacher's chains over gold passages (reading, kept as it was), with
# cot, dapo and r3rag once more (1,500 batches of the chain mix lost 4 points of oracle reading and left 8%
# and 14% format failures in DAPO's and R3-RAG's loops: experiments/results/tiny_lm.md, "Issue 64").
GENERALIST_LAYOUT = tuple(
    "demos:cot demos:cot demos:cot demos:cot qa qa stoprag_intermediate demos:stoprag_query"
    " demos:stoprag_final demos:dapo demos:dapo demos:evorag demos:r3rag demos:r3rag demos:apex_plan"
    " demos:apex_exec demos:apex_final".split()
)


@dataclass(frozen=True)
class Recipe(TinySizes):
    """The recipe's settings (``generator.*`` of conf/generator/tiny.yaml); the defaults are the shipped
    checkpoint's. The model's sizes (hidden, layers, heads, kv_heads, intermediate, max_length) are
    :class:`~rag_lab.train.tiny.model.TinySizes`'."""

    # demonstrations per protocol, in words (sampled from the teacher's rollouts on the training split)
    words_per_protocol: PositiveInt = 60_000
    k: PositiveInt = 3
    iterations: PositiveInt = 6
    # the protocols to demonstrate (null: every protocol)
    protocols: list[str] | None = None
    # the reading stage first: reading_steps batches of reading_batch_size items (0: none)
    reading_steps: NonNegativeInt = 6000
    reading_batch_size: PositiveInt = 32
    # the reading items' layout, or a list of layouts taking turns batch by batch: "drill" (reading_pages),
    # "qa" (qa_reading_item, up to reading_max_pages), "stoprag_intermediate" (one page, one question,
    # Stop-RAG's question-first prompt), "demos" (every teacher demonstration, renamed)
    reading_layout: str | Sequence[str] = ("qa", "stoprag_intermediate", "demos")
    reading_max_pages: PositiveInt = 5
    # questions per qa reading item, at most (about any of its pages)
    reading_max_questions: PositiveInt = 6
    # a protocol stage last, cached apart (the model before it is reused): tune_steps batches of
    # reading_batch_size in tune_layout (the reading layouts; "demos:<protocol>" weights a protocol), at
    # tune_lr, each completion ending with its protocol's stop (0: none)
    tune_steps: NonNegativeInt = 2000
    tune_layout: str | Sequence[str] = TUNE_LAYOUT
    tune_lr: Positive = 1e-3
    # a chain stage after it, cached apart: chain_steps batches of reading_batch_size in chain_layout at
    # chain_lr, where demos:cot draws the teacher's chain-of-thought over each training question's gold
    # passages (policy=oracle_rag policy.reader=cot) as well as over retrieved ones (IRCoT's) (0: none)
    chain_steps: NonNegativeInt = 5000
    chain_layout: str | Sequence[str] = CHAIN_LAYOUT
    chain_lr: Positive = 1e-3
    # a generalist stage last (issue 64), cached apart (started from a shipped checkpoint of the stages
    # before it when one fits): generalist_steps batches (0: none) in generalist_layout at generalist_lr,
    # where every demos:<protocol> draws the generalist's demonstrations (the world teacher without the
    # answer key's plans and searches, acting by the habits below) and demos:cot the chain stage's pool
    generalist_steps: NonNegativeInt = 5000
    generalist_layout: str | Sequence[str] = GENERALIST_LAYOUT
    generalist_lr: Positive = 1e-3
    # the generalist's habits (rag_lab.env.teacher.generalist.Habits): searches before it answers, the
    # chance of one fewer or one more, of a verbatim query, of a plan that is the question whole
    generalist_searches: PositiveInt = 2
    generalist_jitter: Probability = 0.35
    generalist_verbatim: Probability = 0.3
    generalist_whole_plan: Probability = 0.6

    @property
    def habits(self) -> Habits:
        return Habits(
            self.generalist_searches,
            self.generalist_jitter,
            self.generalist_verbatim,
            self.generalist_whole_plan,
        )

    # the vocabulary (its token ids follow the counts) is counted over the corpus, the training items and
    # every demonstration of up to this many words (0: none); these texts train nothing
    vocab_demo_words: NonNegativeInt = 80
    # passes over the demonstrations (the SFT step count follows from it and the batch size)
    epochs: NonNegative = 1.0
    batch_size: PositiveInt = 16
    lr: Positive = 3e-3
    warmup_steps: NonNegativeInt = 50
    completion_only_loss: bool = True
    # the names' words as their syllables (Lia ##kria ##burg: build_tokenizer's pieces), not one token each
    name_pieces: bool = True
    # SFT also on single-page reading drills from the corpus, in each reading layout (DRILLS)
    drills: bool = True
    # each SFT example gets its entities renamed at random (renamer), a fresh renaming per epoch
    rename_entities: bool = True
    train_seed: int = 0
