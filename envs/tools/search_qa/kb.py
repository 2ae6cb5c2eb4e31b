"""A fictional knowledge base generated per seed: people, companies, cities, countries.

Names are built from syllables, so no model has memorized a fact about them;
every fact is in exactly one entity's document (and names of related entities
appear in others, as links do on Wikipedia).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "r", "s", "t", "v", "z", "br", "dr", "th")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ei", "ou")
_CITY_ENDINGS = ("haven", "mora", "stead", "port", "vale", "grad", "field", "wick")
_COMPANY_ENDINGS = ("Labs", "Works", "Dynamics", "Foods", "Motors", "Textiles", "Press", "Optics")
INDUSTRIES = {
    "Labs": "biotechnology",
    "Works": "steel",
    "Dynamics": "aerospace",
    "Foods": "food",
    "Motors": "automotive",
    "Textiles": "textile",
    "Press": "publishing",
    "Optics": "optics",
}
OCCUPATIONS = (
    "architect", "chemist", "painter", "engineer", "novelist", "cartographer",
    "violinist", "botanist", "economist", "photographer", "geologist", "sculptor",
)  # fmt: skip
COUNTRIES = ("Aldoria", "Brevonia", "Caskaria", "Dunmere", "Estravia", "Folvania")


@dataclass(frozen=True)
class City:
    """A city: its country, founding year and population."""

    name: str
    country: str
    founded: int
    population: int


@dataclass(frozen=True)
class Company:
    """A company: industry, founding year, headquarters city and founder (a person's name)."""

    name: str
    industry: str
    founded: int
    headquarters: str
    founder: str


@dataclass(frozen=True)
class Person:
    """A person: birth year, birthplace city, occupation and employer (a company's name)."""

    name: str
    born: int
    birthplace: str
    occupation: str
    employer: str


@dataclass(frozen=True)
class Document:
    """One searchable document: an entity's name as title, and its text."""

    title: str
    text: str


@dataclass(frozen=True)
class KnowledgeBase:
    """The entities and their documents."""

    cities: dict[str, City]
    companies: dict[str, Company]
    people: dict[str, Person]
    documents: list[Document]


class _Names:
    """Unique pronounceable names from one generator."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.used: set[str] = set()

    def word(self, syllables: int) -> str:
        parts = [
            _ONSETS[int(self.rng.integers(len(_ONSETS)))]
            + _VOWELS[int(self.rng.integers(len(_VOWELS)))]
            for _ in range(syllables)
        ]
        return "".join(parts).capitalize()

    def unique(self, make: Callable[[], str]) -> str:
        while True:
            name = make()
            # Unique words, not only unique names: a search for one name must
            # not match another entity's name ("Labs" and the like excepted).
            words = set(name.split()) - set(_COMPANY_ENDINGS)
            if not words & self.used:
                self.used.update(words)
                return name


def generate_kb(
    rng: np.random.Generator, *, num_people: int = 24, num_companies: int = 8, num_cities: int = 8
) -> KnowledgeBase:
    """Draw a knowledge base and write one document per entity."""
    names = _Names(rng)

    def pick(options: list[str] | tuple[str, ...]) -> str:
        return options[int(rng.integers(len(options)))]

    city_names = [
        names.unique(lambda: names.word(2) + pick(_CITY_ENDINGS)) for _ in range(num_cities)
    ]
    populations = rng.choice(np.arange(5, 900), size=num_cities, replace=False) * 1000
    cities = {
        name: City(name, pick(COUNTRIES), int(rng.integers(1100, 1900)), int(population))
        for name, population in zip(city_names, populations, strict=True)
    }
    person_names = [
        names.unique(lambda: f"{names.word(2)} {names.word(3)}") for _ in range(num_people)
    ]
    company_names = [
        names.unique(lambda: f"{names.word(2)} {pick(_COMPANY_ENDINGS)}")
        for _ in range(num_companies)
    ]
    founders = rng.choice(num_people, size=num_companies, replace=False)
    founding_years = rng.choice(np.arange(1850, 2015), size=num_companies, replace=False)
    companies = {
        name: Company(
            name,
            INDUSTRIES[name.split()[-1]],
            int(year),
            pick(city_names),
            person_names[int(founder)],
        )
        for name, founder, year in zip(company_names, founders, founding_years, strict=True)
    }
    birth_years = rng.choice(np.arange(1900, 1996), size=num_people, replace=False)
    people = {
        name: Person(name, int(year), pick(city_names), pick(OCCUPATIONS), pick(company_names))
        for name, year in zip(person_names, birth_years, strict=True)
    }
    documents = [
        *(_city_document(city) for city in cities.values()),
        *(_company_document(company) for company in companies.values()),
        *(_person_document(person) for person in people.values()),
    ]
    order = rng.permutation(len(documents))
    return KnowledgeBase(cities, companies, people, [documents[i] for i in order])


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def _city_document(city: City) -> Document:
    text = (
        f"{city.name} is a city in {city.country}. It was founded in {city.founded} and has "
        f"about {city.population} inhabitants."
    )
    return Document(city.name, text)


def _company_document(company: Company) -> Document:
    text = (
        f"{company.name} is {_article(company.industry)} {company.industry} company founded in "
        f"{company.founded} by {company.founder}. Its headquarters are in {company.headquarters}."
    )
    return Document(company.name, text)


def _person_document(person: Person) -> Document:
    text = (
        f"{person.name} (born {person.born}) is {_article(person.occupation)} "
        f"{person.occupation} from {person.birthplace}. {person.name.split()[0]} works at "
        f"{person.employer}."
    )
    return Document(person.name, text)
