"""A deterministic fictional world: invented people, cities, countries and films, their
relations, Wikipedia-like passages about them, and multi-hop questions with gold supports
and ``#n`` decompositions. Names are invented, so no model can answer without retrieval.

Hand-written: no library generates multi-hop QA worlds. First names and surnames come from
disjoint syllable pools, so no person's name is another's reversed ("A B" vs "B A"), a
collision that makes plain BM25 over titles confuse people (../shared/STACK.md).
"""

import random
from dataclasses import dataclass, field

from rag_lab.data.contexts import passage_id

ONSETS = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "kr", "st", "th"]
VOWELS = ["a", "e", "i", "o", "u", "ai", "eo", "ia"]
FIRST_CODAS = ["a", "o", "ine", "elle", "is", "an", "ora", "ius"]
LAST_CODAS = ["ford", "mont", "wick", "stad", "berg", "vale", "holm", "dorf", "ton"]
PLACE_CODAS = ["grad", "port", "haven", "mere", "burg", "polis", "field"]
COUNTRY_CODAS = ["ia", "land", "istan", "ovia", "aria"]
OCCUPATIONS = ["painter", "novelist", "film director", "chemist", "composer", "architect", "actor"]

PERSON_TEMPLATES = [
    "{name} (born {year}) is a {occupation}. {name} was born in {city}.",
    "{name} is a {occupation} born in {year}. Born in {city}, {name} later became well known.",
    "Born in {city} in {year}, {name} is a {occupation}.",
]
CITY_TEMPLATES = ["{city} is a city in {country}.", "{city} is a town located in {country}."]
COUNTRY_TEMPLATES = ["{country} is a country. Its capital is {capital}."]
FILM_TEMPLATES = [
    "{film} is a {year} film directed by {director}.",
    "{film} is a film released in {year}. It was directed by {director}.",
]


@dataclass
class World:
    people: dict[str, dict] = field(default_factory=dict)
    cities: dict[str, str] = field(default_factory=dict)  # city -> country
    countries: dict[str, str] = field(default_factory=dict)  # country -> capital
    films: dict[str, dict] = field(default_factory=dict)
    passages: dict[str, tuple[str, str]] = field(default_factory=dict)  # id -> (title, text)
    # Entities whose passage is withheld from the corpus: questions needing them are unanswerable.
    withheld: set[str] = field(default_factory=set)


def _word(rng: random.Random, codas: list[str], syllables: int) -> str:
    parts = [rng.choice(ONSETS) + rng.choice(VOWELS) for _ in range(syllables)]
    return ("".join(parts) + rng.choice(codas)).capitalize()


def _unique(rng: random.Random, n: int, make, taken: set[str]) -> list[str]:
    out: list[str] = []
    while len(out) < n:
        name = make()
        if name not in taken:
            taken.add(name)
            out.append(name)
    return out


def build_world(
    rng: random.Random, n_people: int, n_cities: int, n_countries: int, n_films: int, withhold_rate: float
) -> World:
    taken: set[str] = set()
    w = World()
    countries = _unique(rng, n_countries, lambda: _word(rng, COUNTRY_CODAS, 1), taken)
    cities = _unique(rng, n_cities, lambda: _word(rng, PLACE_CODAS, rng.randint(1, 2)), taken)
    firsts = _unique(rng, max(30, n_people // 4), lambda: _word(rng, FIRST_CODAS, 1), taken)
    lasts = _unique(rng, max(30, n_people // 4), lambda: _word(rng, LAST_CODAS, 1), taken)
    people = _unique(rng, n_people, lambda: f"{rng.choice(firsts)} {rng.choice(lasts)}", taken)
    films = _unique(rng, n_films, lambda: "The " + _word(rng, ["", "s", "er"], 2), taken)
    for i, city in enumerate(cities):
        w.cities[city] = countries[i % len(countries)]
    for country in countries:
        w.countries[country] = rng.choice([c for c in cities if w.cities[c] == country])
    for name in people:
        occupation = rng.choice(OCCUPATIONS)
        w.people[name] = {
            "city": rng.choice(cities),
            "year": rng.randint(1900, 1995),
            "occupation": occupation,
        }
    directors = [p for p in people if w.people[p]["occupation"] == "film director"] or people
    for film in films:
        w.films[film] = {"director": rng.choice(directors), "year": rng.randint(1950, 2020)}
    w.withheld = {p for p in people if rng.random() < withhold_rate}
    _write_passages(rng, w)
    return w


def _write_passages(rng: random.Random, w: World) -> None:
    def add(title: str, text: str) -> None:
        if title not in w.withheld:
            w.passages[passage_id(title, text)] = (title, text)

    for name, p in w.people.items():
        add(name, rng.choice(PERSON_TEMPLATES).format(name=name, **p))
    for city, country in w.cities.items():
        add(city, rng.choice(CITY_TEMPLATES).format(city=city, country=country))
    for country, capital in w.countries.items():
        add(country, rng.choice(COUNTRY_TEMPLATES).format(country=country, capital=capital))
    for film, f in w.films.items():
        add(film, rng.choice(FILM_TEMPLATES).format(film=film, **f))


def make_questions(rng: random.Random, w: World) -> list[dict]:
    """Questions of several kinds, each with answers, supports (titles) and a decomposition."""
    qs: list[dict] = []

    seen: set[str] = set()

    def q(kind: str, question: str, answer: str, steps: list[tuple[str, str, str]]) -> None:
        if question in seen:  # e.g. the same comparison pair drawn twice
            return
        seen.add(question)
        supports = [title for _, _, title in steps]
        qs.append(
            {
                "type": kind,
                "question": question,
                "answer": answer,
                "hops": len(steps),
                "answerable": not any(t in w.withheld for t in supports),
                "decomposition": [{"question": s, "answer": a, "title": t} for s, a, t in steps],
            }
        )

    for name, p in w.people.items():
        city, country = p["city"], w.cities[p["city"]]
        q("single_hop", f"Where was {name} born?", city, [(f"Where was {name} born?", city, name)])
        q(
            "compositional",
            f"In which country was {name} born?",
            country,
            [(f"Where was {name} born?", city, name), ("In which country is #1?", country, city)],
        )
    for film, f in w.films.items():
        d = f["director"]
        city, country = w.people[d]["city"], w.cities[w.people[d]["city"]]
        hop1 = (f"Who directed {film}?", d, film)
        q(
            "compositional",
            f"Where was the director of {film} born?",
            city,
            [hop1, ("Where was #1 born?", city, d)],
        )
        q(
            "compositional",
            f"In which country was the director of {film} born?",
            country,
            [hop1, ("Where was #1 born?", city, d), ("In which country is #2?", country, city)],
        )
    names = list(w.people)
    for _ in range(len(names) // 2):
        a, b = rng.sample(names, 2)
        ya, yb = w.people[a]["year"], w.people[b]["year"]
        if ya == yb:
            continue
        first = a if ya < yb else b
        q(
            "comparison",
            f"Who was born first, {a} or {b}?",
            first,
            [(f"When was {a} born?", str(ya), a), (f"When was {b} born?", str(yb), b)],
        )
    return qs
