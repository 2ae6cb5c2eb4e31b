"""Single-hop, bridge and comparison questions over a knowledge base, and QA metrics.

Each question carries the searches an expert would make, turn by turn (the
oracle's plan): one search for a single-hop question, two in a row for a
bridge question (the second names what the first found), two at once for a
comparison.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from agentgym.envs.tools.search_qa.kb import KnowledgeBase

QUESTION_TYPES = ("single", "bridge", "comparison")
"""Question types: one fact, a chain of two facts, or two facts compared."""


@dataclass(frozen=True)
class QAQuestion:
    """A question with its answer.

    Attributes:
        type: One of :data:`QUESTION_TYPES`.
        question: The question text.
        answer: The gold answer.
        plan: The searches an expert makes, one tuple of queries per turn.
    """

    type: str
    question: str
    answer: str
    plan: tuple[tuple[str, ...], ...]


def _pick(rng: np.random.Generator, options: list[str]) -> str:
    return options[int(rng.integers(len(options)))]


def single_hop(rng: np.random.Generator, kb: KnowledgeBase) -> QAQuestion:
    person = kb.people[_pick(rng, sorted(kb.people))]
    company = kb.companies[_pick(rng, sorted(kb.companies))]
    city = kb.cities[_pick(rng, sorted(kb.cities))]
    facts = [
        (f"In what year was {person.name} born?", str(person.born), person.name),
        (f"In which city was {person.name} born?", person.birthplace, person.name),
        (f"What is the occupation of {person.name}?", person.occupation, person.name),
        (f"In what year was {company.name} founded?", str(company.founded), company.name),
        (
            f"In which city are the headquarters of {company.name}?",
            company.headquarters,
            company.name,
        ),
        (f"Who founded {company.name}?", company.founder, company.name),
        (f"In which country is {city.name}?", city.country, city.name),
    ]
    question, answer, query = facts[int(rng.integers(len(facts)))]
    return QAQuestion("single", question, answer, ((query,),))


def bridge(rng: np.random.Generator, kb: KnowledgeBase) -> QAQuestion:
    person = kb.people[_pick(rng, sorted(kb.people))]
    company = kb.companies[_pick(rng, sorted(kb.companies))]
    founder = kb.people[company.founder]
    employer = kb.companies[person.employer]
    chains = [
        (
            f"In which country was {person.name} born?",
            kb.cities[person.birthplace].country,
            (person.name, person.birthplace),
        ),
        (
            f"In which city are the headquarters of the company that {person.name} works for?",
            employer.headquarters,
            (person.name, employer.name),
        ),
        (
            f"In what year was the founder of {company.name} born?",
            str(founder.born),
            (company.name, founder.name),
        ),
        (
            f"What is the occupation of the founder of {company.name}?",
            founder.occupation,
            (company.name, founder.name),
        ),
    ]
    question, answer, (first, second) = chains[int(rng.integers(len(chains)))]
    return QAQuestion("bridge", question, answer, ((first,), (second,)))


def comparison(rng: np.random.Generator, kb: KnowledgeBase) -> QAQuestion:
    kind = int(rng.integers(3))
    if kind == 0:
        p, q = (kb.people[n] for n in rng.choice(sorted(kb.people), size=2, replace=False))
        first, second = p.name, q.name
        question = f"Who was born earlier, {first} or {second}?"
        answer = first if p.born < q.born else second
    elif kind == 1:
        c, d = (kb.companies[n] for n in rng.choice(sorted(kb.companies), size=2, replace=False))
        first, second = c.name, d.name
        question = f"Which company was founded first, {first} or {second}?"
        answer = first if c.founded < d.founded else second
    else:
        x, y = (kb.cities[n] for n in rng.choice(sorted(kb.cities), size=2, replace=False))
        first, second = x.name, y.name
        question = f"Which city has more inhabitants, {first} or {second}?"
        answer = first if x.population > y.population else second
    return QAQuestion("comparison", question, answer, ((first, second),))


GENERATORS: dict[str, Callable[[np.random.Generator, KnowledgeBase], QAQuestion]] = {
    "single": single_hop,
    "bridge": bridge,
    "comparison": comparison,
}
"""Question generators by type; years, birth years and populations are all distinct."""


def normalize_answer(text: str) -> str:
    """SQuAD normalization: lower case, no punctuation, no articles, single spaces."""
    text = "".join(char for char in text.lower() if char not in string.punctuation)
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


def exact_match(prediction: str, gold: str) -> float:
    """1.0 when the normalized strings are equal, else 0.0."""
    return float(normalize_answer(prediction) == normalize_answer(gold))


def f1_score(prediction: str, gold: str) -> float:
    """Token-overlap F1 of the normalized strings (SQuAD's)."""
    predicted, expected = normalize_answer(prediction).split(), normalize_answer(gold).split()
    common = sum((Counter(predicted) & Counter(expected)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(predicted), common / len(expected)
    return 2 * precision * recall / (precision + recall)
