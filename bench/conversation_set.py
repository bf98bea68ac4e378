"""A deterministic conversational retrieval set (no download, same output for a seed).

``conversations(seed)`` returns 10 multi-session conversations of 320+ turns between two
speakers, with facts planted across sessions (some restated later, some changed later) and
at least 30 questions each, every question carrying the ids (turn offsets) of its evidence.
Question kinds: ``paraphrase`` (little word overlap with the evidence), ``keyword`` (the
words an agent would type) and ``temporal`` ("when ...", the evidence names the day).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Final

SPEAKERS: Final = [
    ("Caroline", "Melanie"),
    ("Jon", "Gina"),
    ("Priya", "Tom"),
    ("Ahmed", "Lena"),
    ("Sofia", "Marcus"),
    ("Kenji", "Olivia"),
    ("Ines", "Paul"),
    ("Nadia", "Erik"),
    ("Lucas", "Mei"),
    ("Hannah", "Diego"),
]
DAYS: Final = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]

# (evidence template, paraphrased question, keyword query, slot values)
FACTS: Final = [
    (
        "I adopted a {v} from the animal shelter last week.",
        "What new pet does {a} have at home?",
        "{a} adopted pet",
        ["beagle", "kitten", "parrot"],
    ),
    (
        "I've started taking {v} lessons at the community centre.",
        "Which instrument is {a} learning to play?",
        "{a} lessons",
        ["cello", "piano", "violin"],
    ),
    (
        "We finally moved into our new flat in {v}.",
        "In which city does {a} live now?",
        "{a} moved flat",
        ["Lisbon", "Oslo", "Denver"],
    ),
    (
        "I got a job as a {v} at the hospital downtown.",
        "What is {a}'s profession?",
        "{a} job hospital",
        ["nurse", "pharmacist", "radiologist"],
    ),
    (
        "Honestly my favourite dish is {v}, I could eat it every day.",
        "What food does {a} like the most?",
        "{a} favourite dish",
        ["ramen", "paella", "lasagna"],
    ),
    (
        "I'm vegetarian now, no more {v} for me.",
        "Does {a} still eat meat?",
        "{a} vegetarian",
        ["steak", "bacon", "burgers"],
    ),
    (
        "My sister {v} is getting married in June.",
        "Whose wedding is coming up in {a}'s family?",
        "{a} sister married",
        ["Anna", "Rosa", "Kim"],
    ),
    (
        "I ran the {v} marathon and finished in under four hours.",
        "Which race did {a} complete?",
        "{a} marathon",
        ["Boston", "Berlin", "Chicago"],
    ),
    (
        "I've been reading {v} before bed, it's gripping.",
        "What book is {a} into lately?",
        "{a} reading book",
        ["Dune", "Beloved", "Middlemarch"],
    ),
    (
        "My daughter {v} just started kindergarten.",
        "What is the name of {a}'s child?",
        "{a} daughter kindergarten",
        ["Lily", "Zoe", "Maya"],
    ),
    (
        "We booked a trip to {v} for the summer holidays.",
        "Where is {a} travelling on vacation?",
        "{a} trip summer",
        ["Japan", "Peru", "Iceland"],
    ),
    (
        "I'm allergic to {v}, I found out the hard way.",
        "What can {a} not eat because of an allergy?",
        "{a} allergic",
        ["peanuts", "shellfish", "kiwi"],
    ),
    (
        "I drive an old {v} that my grandfather gave me.",
        "What kind of car does {a} own?",
        "{a} car grandfather",
        ["Volvo", "Beetle", "Mustang"],
    ),
    (
        "I volunteer at the {v} every other weekend.",
        "Where does {a} spend time helping out?",
        "{a} volunteer",
        ["food bank", "library", "zoo"],
    ),
    (
        "My favourite band is {v}, I've seen them live twice.",
        "Which musicians does {a} love?",
        "{a} favourite band",
        ["Radiohead", "ABBA", "Coldplay"],
    ),
]
EVENTS: Final = [
    (
        "went to a {v} on {d}, it was really moving.",
        "When did {a} attend the {v}?",
        ["support group meeting", "pottery workshop", "charity gala", "poetry reading"],
    ),
    (
        "signed up for a {v} on {d} morning.",
        "When is {a}'s {v}?",
        ["dentist appointment", "job interview", "yoga retreat", "driving test"],
    ),
]
FILLER: Final = [
    "How was your day?",
    "Pretty good, thanks. Busy at work as usual.",
    "Did you see the game last night?",
    "Not really, I fell asleep early.",
    "The weather has been so strange lately.",
    "I know, rain one minute and sun the next.",
    "What are you cooking tonight?",
    "Probably just some soup, nothing fancy.",
    "I need a holiday so badly.",
    "Same here, this month has been exhausting.",
    "Have you talked to your parents recently?",
    "Yes, we had a long call on the weekend.",
    "I watched a documentary about the ocean.",
    "Oh nice, was it any good?",
    "Traffic was terrible this morning.",
    "That road is always jammed around eight.",
    "My phone battery keeps dying.",
    "Maybe it's time for a new one.",
    "Let's grab coffee sometime next week.",
    "Sounds great, text me when you're free.",
    "I've been trying to sleep more.",
    "Good idea, it makes such a difference.",
    "The neighbours are renovating again.",
    "Ugh, the noise must be awful.",
]
TURNS: Final = 320
SESSIONS: Final = 8


@dataclass(frozen=True, slots=True)
class Question:
    text: str
    kind: str
    evidence: tuple[int, ...]


@dataclass(slots=True)
class Conversation:
    conv_id: str
    turns: list[tuple[str, str]] = field(default_factory=list)  # (speaker, text)
    questions: list[Question] = field(default_factory=list)


def _place(rng: random.Random, free: list[int], lo: int, hi: int) -> int:
    cands = [i for i in free if lo <= i < hi]
    pos = rng.choice(cands)
    free.remove(pos)
    return pos


def conversation(i: int, seed: int = 7) -> Conversation:
    rng = random.Random(seed * 1000 + i)
    a, b = SPEAKERS[i % len(SPEAKERS)]
    texts: dict[int, tuple[str, str]] = {}
    free = list(range(TURNS))
    conv = Conversation(f"conv-{i}")
    session_len = TURNS // SESSIONS

    def say(pos: int, speaker: str, text: str) -> None:
        texts[pos] = (speaker, text)

    for fi, (tmpl, para, kw, values) in enumerate(FACTS):
        speaker = a if fi % 2 == 0 else b
        v = rng.choice(values)
        first = _place(rng, free, 0, TURNS // 2)
        say(first, speaker, tmpl.format(v=v))
        evidence = [first]
        mode = fi % 3
        if mode == 1:  # restated in a later session, in other words
            again = _place(rng, free, first + session_len, TURNS)
            say(
                again,
                speaker,
                f"Like I said before, {tmpl.format(v=v)[0].lower()}{tmpl.format(v=v)[1:]}",
            )
            evidence.append(again)
        elif mode == 2:  # changed later: only the later turn answers "now"
            new_v = rng.choice([x for x in values if x != v])
            later = _place(rng, free, first + session_len, TURNS)
            say(later, speaker, f"Update: that changed. {tmpl.format(v=new_v)}")
            evidence = [later]
        conv.questions.append(Question(para.format(a=speaker), "paraphrase", tuple(evidence)))
        conv.questions.append(Question(kw.format(a=speaker), "keyword", tuple(evidence)))
    for ei, (tmpl, q, values) in enumerate(EVENTS * 3):
        speaker = a if ei % 2 else b
        v = values[(ei // 2 + i) % len(values)]
        d = rng.choice(DAYS)
        pos = _place(rng, free, 0, TURNS)
        say(pos, speaker, f"I {tmpl.format(v=v, d=d)}")
        conv.questions.append(Question(q.format(a=speaker, v=v), "temporal", (pos,)))
    for pos in range(TURNS):
        if pos not in texts:
            speaker = a if pos % 2 == 0 else b
            say(pos, speaker, rng.choice(FILLER))
    conv.turns = [texts[p] for p in range(TURNS)]
    return conv


def conversations(n: int = 10, seed: int = 7) -> list[Conversation]:
    return [conversation(i, seed) for i in range(n)]
