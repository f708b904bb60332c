"""doc-qa: D long documents picked with Zipf popularity, each request one document plus a short question.

Document d (rank d+1) is picked with probability proportional to 1 / (d+1)^zipf
(zipf = 0: uniform). Documents start with distinct tokens and the questions on one
document start with distinct tokens, so requests on one document share exactly
its `doc_tokens` tokens.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from kvroute.loadgen.workload_base import RequestSpec
from kvroute.loadgen.workloads.content import check_int, check_number, distinct_start


@dataclasses.dataclass(frozen=True)
class DocQAConfig:
    num_requests: int = 200
    documents: int = 16
    doc_tokens: int = 1024
    question_tokens: int = 32
    output_tokens: int = 32
    zipf: float = 1.1  # popularity exponent

    def __post_init__(self) -> None:
        check_int("num_requests", self.num_requests)
        check_int("documents", self.documents)
        check_int("doc_tokens", self.doc_tokens)
        check_int("question_tokens", self.question_tokens)
        check_int("output_tokens", self.output_tokens)
        check_number("zipf", self.zipf)


class DocQAWorkload:
    name = "doc-qa"

    def __init__(self, config: DocQAConfig, seed: int = 0) -> None:
        self.config = config
        self.seed = seed

    def popularity(self) -> np.ndarray:
        weights = 1.0 / np.arange(1, self.config.documents + 1) ** self.config.zipf
        return weights / weights.sum()

    def requests(self) -> list[RequestSpec]:
        c = self.config
        rng = np.random.default_rng([self.seed, 3])
        used_doc: set[int] = set()
        docs = [distinct_start(rng, c.doc_tokens, used_doc) for _ in range(c.documents)]
        picks = rng.choice(c.documents, size=c.num_requests, p=self.popularity())
        used_question: list[set[int]] = [set() for _ in range(c.documents)]
        specs = []
        for i, d in enumerate(picks.tolist()):
            question = distinct_start(rng, c.question_tokens, used_question[d])
            specs.append(RequestSpec(index=i, prompt_ids=docs[d] + question, max_tokens=c.output_tokens,
                                     group=f"doc-{d}"))
        return specs

    def info(self) -> dict:
        return {"workload": self.name, "seed": self.seed, **dataclasses.asdict(self.config)}
