"""A deterministic fictional world: people over four generations (parents, spouses), cities,
countries, films, companies and bands, their relations, and a Wikipedia-like passage per entity.

Hand-written: no library generates multi-hop QA worlds. Names are invented from syllables, so
no model can know a fact without retrieving it. First names and surnames come from disjoint
pools, so no person's name is another's reversed ("A B" vs "B A", a collision that makes BM25
over titles confuse people, ../shared/STACK.md); surnames and first names are shared between
people, which makes near-name distractors ("Tuine Dovale" vs "Feine Dovale") common.

Every relation (``RELATIONS``) is stated by exactly one sentence of its subject's passage, in one
of several phrasings, so a reader that finds the subject's passage can answer; a *withheld*
entity has no passage, so questions that need it are unanswerable.
"""

import random
from dataclasses import dataclass, field

from rag_lab.data.contexts import passage_id

ONSETS = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "kr", "st", "th"]
VOWELS = ["a", "e", "i", "o", "u", "ai", "eo", "ia"]
FEMALE_CODAS = ["a", "ine", "elle", "ora", "ia"]
MALE_CODAS = ["o", "is", "an", "ius", "ek"]
LAST_CODAS = ["ford", "mont", "wick", "stad", "berg", "vale", "holm", "dorf", "ton"]
PLACE_CODAS = ["grad", "port", "haven", "mere", "burg", "polis", "field"]
COUNTRY_CODAS = ["ia", "land", "istan", "ovia", "aria"]
COMPANY_SUFFIXES = ["Industries", "Group", "Works", "Systems", "Holdings"]
OCCUPATIONS = ["painter", "novelist", "chemist", "composer", "architect", "actor", "physician", "poet"]
MONTHS = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
]
GENERATIONS = 4


@dataclass(frozen=True)
class Relation:
    """A fact about an entity of kind ``domain``; ``target`` is an entity kind or None for a literal."""

    name: str
    domain: str
    target: str | None
    # The sub-question asking for this fact about {x}.
    question: str
    # The noun phrase naming the answer, to nest chains ("the director of {x}").
    phrase: str


RELATIONS = {
    r.name: r
    for r in [
        Relation("director", "film", "person", "Who directed {x}?", "the director of {x}"),
        Relation("release_year", "film", None, "When was {x} released?", ""),
        Relation("founder", "company", "person", "Who founded {x}?", "the founder of {x}"),
        Relation(
            "headquarters", "company", "city", "Where is {x} headquartered?", "the headquarters city of {x}"
        ),
        Relation("founded_year", "company", None, "When was {x} founded?", ""),
        Relation("origin", "band", "city", "In which city was {x} formed?", "the city where {x} was formed"),
        Relation("birthplace", "person", "city", "Where was {x} born?", "the birthplace of {x}"),
        Relation("birth_date", "person", None, "When was {x} born?", ""),
        Relation("death_date", "person", None, "When did {x} die?", ""),
        Relation("nationality", "person", "country", "What is the nationality of {x}?", "the country of {x}"),
        Relation("occupation", "person", None, "What is the occupation of {x}?", ""),
        Relation("mother", "person", "person", "Who is the mother of {x}?", "the mother of {x}"),
        Relation("father", "person", "person", "Who is the father of {x}?", "the father of {x}"),
        Relation("spouse", "person", "person", "Who is the spouse of {x}?", "the spouse of {x}"),
        Relation("country", "city", "country", "In which country is {x}?", "the country of {x}"),
        Relation("capital", "country", "city", "What is the capital of {x}?", "the capital of {x}"),
    ]
}

# One sentence per relation (several phrasings); {s}: subject, {v}: value, {P}/{p}: pronoun, {Q}: possessive.
SENTENCES = {
    "director": ["{s} is a film directed by {v}.", "It was directed by {v}.", "{v} directed {s}."],
    "release_year": ["{s} was released in {v}.", "The film came out in {v}.", "{s} premiered in {v}."],
    "founder": ["{s} was founded by {v}.", "{v} founded {s}.", "Its founder is {v}."],
    "headquarters": [
        "{s} is headquartered in {v}.",
        "Its headquarters are in {v}.",
        "The company is based in {v}.",
    ],
    "founded_year": ["{s} was established in {v}.", "The company dates from {v}.", "It was founded in {v}."],
    "origin": [
        "{s} is a band formed in {v}.",
        "The band was formed in {v}.",
        "{s} formed in the city of {v}.",
    ],
    "birthplace": ["{s} was born in {v}.", "{P} is a native of {v}.", "{s} was born in the city of {v}."],
    "birth_date": ["{s} was born on {v}.", "{P} was born on {v}.", "{Q} date of birth is {v}."],
    "death_date": ["{s} passed away on {v}.", "{P} died on {v}.", "{Q} date of death is {v}."],
    "nationality": [
        "{s} holds the nationality of {v}.",
        "{P} is from {v}.",
        "By nationality {p} is from {v}.",
    ],
    "occupation": ["{s} is a {v}.", "{P} works as a {v}.", "{s} is known as a {v}."],
    "mother": [
        "The mother of {s} is {v}.",
        "{s} is the child of {v}, {Q_l} mother.",
        "{P} was born to {v}, {Q_l} mother.",
    ],
    "father": [
        "The father of {s} is {v}.",
        "{s} is the child of {v}, {Q_l} father.",
        "{P} was raised by {v}, {Q_l} father.",
    ],
    "spouse": ["{s} married {v}.", "{s} is married to {v}.", "{Q} spouse is {v}."],
    "country": ["{s} is a city in {v}.", "{s} is a town located in {v}.", "{s} lies in {v}."],
    "capital": [
        "The capital of {s} is {v}.",
        "{s} is a country whose capital is {v}.",
        "{v} is the capital of {s}.",
    ],
}
# Filler sentences (no relation) make passages less uniform and give BM25 distractor words.
FILLERS = {
    "person": ["{s} has received several awards.", "{P} is remembered for {Q_l} early work."],
    "city": ["It has a population of about {n} thousand.", "{s} is known for its old market."],
    "country": ["{s} has a long coastline.", "The country is divided into {n} provinces."],
    "film": ["The film received mixed reviews.", "It runs for about {n} minutes."],
    "company": ["It employs about {n} thousand people.", "The company went public in its second decade."],
    "band": ["The band released {n} albums.", "Its music mixes folk and rock."],
}


@dataclass
class Entity:
    name: str
    kind: str
    facts: dict[str, str] = field(default_factory=dict)
    gender: str = ""
    # Sort key for "which came first" comparisons (a date as yyyymmdd, or a year).
    order: dict[str, int] = field(default_factory=dict)


@dataclass
class World:
    entities: dict[str, Entity] = field(default_factory=dict)
    passages: dict[str, tuple[str, str]] = field(default_factory=dict)  # id -> (title, text)
    # Entities whose passage is withheld from the corpus: questions needing them are unanswerable.
    withheld: set[str] = field(default_factory=set)

    def of_kind(self, kind: str) -> list[Entity]:
        return [e for e in self.entities.values() if e.kind == kind]


class _Namer:
    def __init__(self, rng: random.Random):
        self.rng = rng
        self.taken = set()

    @staticmethod
    def syllables_for(count: int, codas: list[str]) -> int:
        """Fewest syllables whose name space is at least 4x ``count`` (short names in small worlds)."""
        syllables = 1
        while (len(ONSETS) * len(VOWELS)) ** syllables * len(codas) < 4 * count:
            syllables += 1
        return syllables

    def word(self, codas: list[str], syllables: int) -> str:
        parts = [self.rng.choice(ONSETS) + self.rng.choice(VOWELS) for _ in range(syllables)]
        return ("".join(parts) + self.rng.choice(codas)).capitalize()

    def unique(self, make, fallback=None) -> str:
        """A fresh name from ``make``; after 50 collisions, from ``fallback`` (a wider space)."""
        for attempt in range(10_000):
            name = make() if fallback is None or attempt < 50 else fallback()
            if name not in self.taken:
                self.taken.add(name)
                return name
        raise RuntimeError("the name space is exhausted: raise the name pools or lower the world sizes")


def date_text(rng: random.Random, year: int) -> tuple[str, int]:
    """('12 March 1943', 19430312): the written date and its sort key."""
    month, day = rng.randrange(12), rng.randint(1, 28)
    return f"{day} {MONTHS[month]} {year}", year * 10000 + (month + 1) * 100 + day


def date_alias(date: str) -> str:
    """'12 March 1943' -> 'March 12, 1943' (an answer alias)."""
    day, month, year = date.split()
    return f"{month} {day}, {year}"


def build_world(rng: random.Random, sizes: dict[str, int], withhold_rate: float) -> World:
    """``sizes``: people, cities, countries, films, companies, bands."""
    w, namer = World(), _Namer(rng)

    def add(kind: str, name: str, gender: str = "") -> Entity:
        e = Entity(name, kind, gender=gender)
        w.entities[name] = e
        return e

    s_country = namer.syllables_for(sizes["countries"], COUNTRY_CODAS)
    countries = [
        add("country", namer.unique(lambda: namer.word(COUNTRY_CODAS, s_country)))
        for _ in range(sizes["countries"])
    ]
    cities = [
        add("city", namer.unique(lambda: namer.word(PLACE_CODAS, rng.randint(1, 2))))
        for _ in range(sizes["cities"])
    ]
    for i, city in enumerate(cities):
        city.facts["country"] = countries[i % len(countries)].name
    for country in countries:
        country.facts["capital"] = rng.choice([c.name for c in cities if c.facts["country"] == country.name])
    _add_people(rng, w, namer, cities, sizes["people"])
    people = w.of_kind("person")
    late = [p for p in people if p.order["birth_date"] >= 19200000] or people
    for _ in range(sizes["films"]):
        film = add("film", namer.unique(lambda: "The " + namer.word(["", "s", "er"], 2)))
        director = rng.choice(late[: max(1, len(late) // 3)])  # a few prolific directors
        director.facts["occupation"] = "film director"
        year = rng.randint(1950, 2020)
        film.facts |= {"director": director.name, "release_year": str(year)}
        film.order["release_year"] = year
    s_company = namer.syllables_for(sizes["companies"] // len(COMPANY_SUFFIXES) + 1, LAST_CODAS)
    for _ in range(sizes["companies"]):
        company = add(
            "company",
            namer.unique(lambda: f"{namer.word(LAST_CODAS, s_company)} {rng.choice(COMPANY_SUFFIXES)}"),
        )
        founder, year = rng.choice(people), rng.randint(1880, 2010)
        company.facts |= {
            "founder": founder.name,
            "headquarters": rng.choice(cities).name,
            "founded_year": str(year),
        }
        company.order["founded_year"] = year
    for _ in range(sizes["bands"]):
        band = add(
            "band",
            namer.unique(lambda: "The " + namer.word(["s", "ers", "ies"], 1) + " " + namer.word(["s"], 1)),
        )
        band.facts["origin"] = rng.choice(cities).name
    w.withheld = {
        e.name for e in w.entities.values() if e.kind in ("person", "film") and rng.random() < withhold_rate
    }
    for e in w.entities.values():
        if e.name not in w.withheld:
            text = passage_text(rng, e)
            w.passages[passage_id(e.name, text)] = (e.name, text)
    return w


def _add_people(rng: random.Random, w: World, namer: _Namer, cities: list[Entity], n: int) -> None:
    n_first, n_last = max(12, n // 8), max(20, n // 5)
    s_female, s_male = namer.syllables_for(n_first, FEMALE_CODAS), namer.syllables_for(n_first, MALE_CODAS)
    s_last = namer.syllables_for(n_last, LAST_CODAS)
    female = [namer.unique(lambda: namer.word(FEMALE_CODAS, s_female)) for _ in range(n_first)]
    male = [namer.unique(lambda: namer.word(MALE_CODAS, s_male)) for _ in range(n_first)]
    surnames = [namer.unique(lambda: namer.word(LAST_CODAS, s_last)) for _ in range(n_last)]
    previous_couples: list[tuple[Entity, Entity]] = []
    for gen in range(GENERATIONS):
        members = []
        for _ in range(n // GENERATIONS):
            gender = rng.choice("fm")
            parents = rng.choice(previous_couples) if previous_couples else None
            surname = parents[1].name.split()[1] if parents else rng.choice(surnames)
            first = female if gender == "f" else male
            # A child takes the father's surname; when every first name is taken with it, a new one.
            name = namer.unique(
                lambda first=first, surname=surname: f"{rng.choice(first)} {surname}",
                fallback=lambda first=first: f"{rng.choice(first)} {rng.choice(surnames)}",
            )
            p = Entity(name, "person", gender=gender)
            w.entities[name] = p
            city = rng.choice(cities)
            birth, key = date_text(rng, 1850 + 35 * gen + rng.randint(0, 25))
            p.facts |= {"birthplace": city.name, "birth_date": birth, "occupation": rng.choice(OCCUPATIONS)}
            nationality = (
                city.facts["country"]
                if rng.random() < 0.85
                else w.entities[rng.choice(cities).name].facts["country"]
            )
            p.facts["nationality"] = nationality
            p.order["birth_date"] = key
            if gen < GENERATIONS - 1 or rng.random() < 0.2:
                death, dkey = date_text(rng, min(2024, key // 10000 + rng.randint(40, 90)))
                p.facts["death_date"], p.order["death_date"] = death, dkey
            if parents:
                p.facts["mother"], p.facts["father"] = parents[0].name, parents[1].name
            members.append(p)
        women = [p for p in members if p.gender == "f"]
        men = [p for p in members if p.gender == "m"]
        rng.shuffle(women)
        previous_couples = []
        for woman, man in zip(women, men, strict=False):
            if rng.random() < 0.75:
                woman.facts["spouse"], man.facts["spouse"] = man.name, woman.name
                previous_couples.append((woman, man))


def passage_text(rng: random.Random, e: Entity) -> str:
    """The entity's passage: one sentence per fact, in a random phrasing, plus a filler."""
    he = e.gender == "m"
    slots = {
        "s": e.name,
        "P": "He" if he else "She",
        "p": "he" if he else "she",
        "Q": "His" if he else "Her",
        "Q_l": "his" if he else "her",
        "n": str(rng.randint(3, 90)),
    }
    if e.kind != "person":
        slots |= {"P": "It", "p": "it", "Q": "Its", "Q_l": "its"}
    sentences = []
    for rel in RELATIONS:
        if rel in e.facts:
            # The first sentence names the subject, so a passage never opens with a pronoun.
            options = [t for t in SENTENCES[rel] if "{s}" in t] if not sentences else SENTENCES[rel]
            sentences.append(rng.choice(options).format(v=e.facts[rel], **slots))
    sentences.insert(rng.randint(1, len(sentences)), rng.choice(FILLERS[e.kind]).format(**slots))
    return " ".join(sentences)
