"""The training corpus: the King James Bible from Debian's bible-kjv package.

`bible -f Gen1:1-Rev22:21` prints one verse per line, "Ge1:1 In the beginning ...".
We keep the verse text (the reference prefix is dropped from the text and kept apart),
and split it into a training and a held-out part: verses are taken in runs of 50, and
every 20th run (runs 19, 39, ...) is held out, so that the held-out 5 % is spread over
every book.
"""
import os
import re
import subprocess

BOOKS = {
    "Ge": "Genesis", "Exo": "Exodus", "Lev": "Leviticus", "Num": "Numbers",
    "Deu": "Deuteronomy", "Josh": "Joshua", "Jdgs": "Judges", "Ruth": "Ruth",
    "1Sm": "1 Samuel", "2Sm": "2 Samuel", "1Ki": "1 Kings", "2Ki": "2 Kings",
    "1Chr": "1 Chronicles", "2Chr": "2 Chronicles", "Ezra": "Ezra", "Neh": "Nehemiah",
    "Est": "Esther", "Job": "Job", "Psa": "Psalms", "Prv": "Proverbs",
    "Eccl": "Ecclesiastes", "SSol": "Song of Solomon", "Isa": "Isaiah", "Jer": "Jeremiah",
    "Lam": "Lamentations", "Eze": "Ezekiel", "Dan": "Daniel", "Hos": "Hosea",
    "Joel": "Joel", "Amos": "Amos", "Obad": "Obadiah", "Jonah": "Jonah", "Mic": "Micah",
    "Nahum": "Nahum", "Hab": "Habakkuk", "Zep": "Zephaniah", "Hag": "Haggai",
    "Zec": "Zechariah", "Mal": "Malachi", "Mat": "Matthew", "Mark": "Mark", "Luke": "Luke",
    "John": "John", "Acts": "Acts", "Rom": "Romans", "1Cor": "1 Corinthians",
    "2Cor": "2 Corinthians", "Gal": "Galatians", "Eph": "Ephesians", "Phi": "Philippians",
    "Col": "Colossians", "1Th": "1 Thessalonians", "2Th": "2 Thessalonians",
    "1Tim": "1 Timothy", "2Tim": "2 Timothy", "Titus": "Titus", "Phmn": "Philemon",
    "Heb": "Hebrews", "Jas": "James", "1Pet": "1 Peter", "2Pet": "2 Peter", "1Jn": "1 John",
    "2Jn": "2 John", "3Jn": "3 John", "Jude": "Jude", "Rev": "Revelation",
}

RUN = 50      # verses per run
EVERY = 20    # every EVERY-th run is held out

_ref = re.compile(r"^(\d?[A-Za-z]+)(\d+):(\d+) (.*)$")


def read_bible(path=None):
    """Returns a list of (reference, text). Runs `bible` unless a saved copy is given."""
    if path and os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            raw = f.read()
    else:
        raw = subprocess.run(["bible", "-f", "Gen1:1-Rev22:21"], check=True,
                             capture_output=True, text=True).stdout
    verses = []
    for line in raw.splitlines():
        m = _ref.match(line.strip())
        if not m:
            continue
        book, ch, vs, text = m.groups()
        verses.append(("%s %s:%s" % (BOOKS[book], ch, vs), text.strip()))
    if len(verses) != 31102:
        raise SystemExit("kjv: expected 31102 verses, got %d" % len(verses))
    return verses


def split(verses):
    train, held = [], []
    for i, v in enumerate(verses):
        (held if (i // RUN) % EVERY == EVERY - 1 else train).append(v)
    return train, held


def runs(verses_with_index):
    """Groups consecutive verses (by original index) into runs, for chat pairs."""
    out, cur, last = [], [], None
    for i, v in verses_with_index:
        if last is not None and i != last + 1:
            out.append(cur)
            cur = []
        cur.append(v)
        last = i
    if cur:
        out.append(cur)
    return out


def split_runs(verses):
    tr, he = [], []
    for i, v in enumerate(verses):
        (he if (i // RUN) % EVERY == EVERY - 1 else tr).append((i, v))
    return runs(tr), runs(he)


_word = re.compile(r"[A-Za-z]+")


def words(text):
    return _word.findall(text)
