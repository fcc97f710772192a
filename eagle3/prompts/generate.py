"""A deterministic, local prompt-set generator with a fixed held-out split.

Thousands of varied chat prompts are made from templates and word lists in this file; nothing is
downloaded. The same arguments give the same bytes on every machine (one seeded generator, no
set iteration, sorted output). Which side of the split a prompt falls on is a function of its text
alone (sha256 bucket), so asking for more prompts adds rows on both sides and never moves one
across: a held-out prompt is never among the prompts data generation regenerates, whatever the
counts. Each row: {"id", "conversations": [{"role": "user", "content"}], "category", "split"}.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError
from ..fsio import atomic_write_text

HELDOUT_BUCKETS = 16  # one text in 16 is held out (bucket 0)

TOPICS = [
    "a binary search", "a hash map", "garbage collection", "a TCP handshake", "the CAP theorem", "a mutex",
    "a semaphore", "a deadlock", "a race condition", "memoization", "dynamic programming", "a linked list",
    "a binary heap", "a trie", "a bloom filter", "consistent hashing", "a B-tree", "a red-black tree",
    "quicksort", "merge sort", "a priority queue", "a graph traversal", "Dijkstra's algorithm", "a spanning tree",
    "a virtual machine", "a container", "a process scheduler", "virtual memory", "a page fault", "a cache line",
    "branch prediction", "a compiler pass", "a lexer", "a parser", "an abstract syntax tree", "type inference",
    "a closure", "a coroutine", "an event loop", "a thread pool", "a lock-free queue", "a write-ahead log",
    "a database index", "a transaction", "two-phase commit", "a consensus protocol", "leader election",
    "a load balancer", "a reverse proxy", "DNS resolution", "TLS", "public-key cryptography", "a hash function",
    "a checksum", "data compression", "a floating point number", "integer overflow", "a bit mask", "recursion",
    "tail calls", "a generator", "an iterator", "a decorator", "dependency injection", "an interface",
    "inheritance", "unit testing", "a code review", "version control", "a merge conflict", "continuous integration",
    "a feature flag", "a rate limiter", "a circuit breaker", "a message queue", "backpressure", "a retry policy",
    "idempotency", "a REST API", "a GPU kernel", "matrix multiplication", "gradient descent", "a neural network",
    "attention in transformers", "tokenization", "speculative decoding", "a KV cache", "quantization",
]
LANGUAGES = ["Python", "C", "Rust", "Go", "Java", "JavaScript", "C++", "Haskell", "SQL", "Bash"]
TASKS = [
    "reverses a string", "checks whether a number is prime", "counts the words in a file", "merges two sorted lists",
    "finds the largest element of an array", "removes duplicates from a list", "computes a factorial",
    "parses a CSV line", "validates an email address", "flattens a nested list", "computes the median",
    "rotates a matrix", "checks balanced parentheses", "converts Celsius to Fahrenheit", "sums the digits of a number",
    "finds the longest common prefix", "implements a stack", "implements a queue with two stacks",
    "computes Fibonacci numbers", "groups words by their anagrams", "formats a byte count for humans",
    "retries a function with exponential backoff", "reads a JSON file safely", "splits a list into chunks",
]
STYLES = [
    "in two sentences", "in one paragraph", "to a beginner", "to an expert", "with an example", "step by step",
    "as a short list", "without jargon", "with an analogy", "in under fifty words", "and give one pitfall",
    "and say when not to use it",
]
VERBS = ["Explain", "Describe", "Summarize", "Teach me", "Outline"]
NOUNS = ["a cat", "the ocean", "a city at night", "autumn", "a lighthouse", "a robot", "the moon", "a library",
         "a train journey", "a mountain", "a garden", "a storm", "an old clock", "a market", "a river"]
FORMS = ["a haiku", "a limerick", "a four-line poem", "a short story opening", "a product description",
         "a riddle", "a diary entry", "a tweet"]
NUMBERS = [3, 4, 5, 7, 10]

TEMPLATES = [
    ("explain", "{verb} {topic} {style}."),
    ("compare", "Compare {topic} and {topic2} {style}."),
    ("code", "Write a {lang} function that {task}."),
    ("code", "Write a {lang} function that {task}, with a docstring and one test."),
    ("code-review", "What can go wrong in a {lang} function that {task}?"),
    ("list", "List {n} facts about {topic}."),
    ("list", "Give {n} tips for using {topic} in {lang}."),
    ("creative", "Write {form} about {noun}."),
    ("creative", "Write {form} about {topic}."),
    ("qa", "Why would someone choose {topic} over {topic2}?"),
    ("qa", "What is the time complexity of {topic}, and why?"),
    ("debug", "My {lang} program that {task} is slow. How do I find out why?"),
    ("design", "Design a small system that uses {topic} and {topic2}. {verb} the parts {style}."),
]
# More ways of asking for code, drawn only when a code share is asked for (a code model's data): the
# default draws stay what they were, so every set made without one keeps its bytes.
MORE_CODE = [
    ("code", "Write a {lang} function that {task}. Handle the edge cases and show example usage."),
    ("code", "Translate a Python function that {task} into {lang}."),
    ("code", "Write idiomatic {lang} code that {task}, and explain each step briefly."),
    ("code-review", "Review a {lang} function that {task}: name three bugs it is likely to have and fix them."),
    ("debug", "My {lang} function that {task} fails on empty input. Show the fix."),
]
CODE_CATEGORIES = ("code", "code-review", "debug")
# More tasks for a code model's data (code-share draws take their {task} from TASKS and these): 24 tasks
# taught a Qwen2.5-Coder drafter the generator's own tasks, not code (2.10 on unseen coding tasks against
# 3.47 on those tasks in other languages, bench/RESULTS.md 2026-12-06). None names a task of the held-out
# code set configs/prompts/qwen-coder-heldout.jsonl (tests/test_promptgen.py).
CODE_TASKS = [
    "returns the nth prime number", "finds the second largest number in a list", "counts the vowels in a string",
    "capitalizes the first letter of each word", "checks whether a number is a power of two",
    "converts a hex string to an integer", "swaps the keys and values of a dictionary",
    "finds the missing number in a sequence from 1 to n", "transposes a matrix", "multiplies two matrices",
    "reverses a linked list", "finds the middle node of a linked list", "merges k sorted lists",
    "implements binary search", "implements insertion sort", "implements heap sort", "implements counting sort",
    "inserts a value into a binary search tree", "checks whether a binary tree is balanced",
    "computes the depth of a binary tree", "returns the level-order traversal of a binary tree",
    "finds the lowest common ancestor of two nodes in a binary search tree", "checks whether a graph is bipartite",
    "counts the connected components of an undirected graph", "detects a cycle in a directed graph",
    "finds every path between two nodes of a graph", "computes a minimum spanning tree with Kruskal's algorithm",
    "implements a union-find structure with path compression", "computes the longest increasing subsequence",
    "computes the longest common subsequence of two strings", "solves the 0/1 knapsack problem",
    "counts the ways to climb n stairs taking one or two steps", "computes the fewest coins that make an amount",
    "finds the maximum subarray sum", "rotates an array by k positions", "moves every zero of an array to its end",
    "finds two numbers of a list that add up to a target", "finds every triplet that sums to zero",
    "checks whether a string has only unique characters", "counts the occurrences of each character",
    "removes punctuation from a string", "wraps text at a given column", "truncates a string with an ellipsis",
    "checks whether a string is a valid IPv4 address", "parses a URL query string into a dictionary",
    "builds a URL query string from a dictionary", "escapes the HTML special characters of a string",
    "strips HTML tags from a string", "validates a hexadecimal color code",
    "converts seconds to hours, minutes and seconds", "returns the day of the week of a date",
    "counts the days between two dates", "formats a number as currency", "rounds a number to n significant figures",
    "computes the standard deviation of a list", "computes the mode of a list",
    "scales a list of numbers to the range 0 to 1", "computes the dot product of two vectors",
    "computes the distance between two points", "checks whether a point lies inside a rectangle",
    "computes the area of a polygon from its vertices", "checks whether a number is a perfect square",
    "generates a random password of a given length", "shuffles a list in place",
    "samples k items uniformly from a stream", "implements a circular buffer", "implements a min stack",
    "implements a simple event emitter", "debounces a function", "throttles a function", "memoizes a function",
    "measures how long a function takes", "counts the non-empty lines of a file",
    "writes a list of dictionaries to a CSV file", "merges two dictionaries recursively",
    "flattens a nested dictionary into dotted keys", "groups a list of records by a key",
    "sorts a list of dictionaries by a field", "removes duplicate records by a key, keeping the first",
    "finds the longest palindromic substring", "counts the islands of a grid of land and water",
    "flood-fills a region of a grid", "returns a matrix in spiral order", "checks whether a matrix is symmetric",
    "finds the kth smallest element of a list", "merges two sorted arrays in place",
    "encodes bytes as base64 without a library", "computes a CRC32 checksum", "checks whether a string is a pangram",
    "generates every permutation of a list of numbers", "computes n choose k", "converts a string to a slug",
    "masks all but the last four digits of a card number", "validates an ISBN-10 number",
    "computes the Hamming distance of two integers", "reverses the words of a sentence",
    "finds the longest word of a sentence", "checks whether two rectangles overlap",
]


@dataclass(frozen=True)
class GeneratedSet:
    train: list[dict]
    heldout: list[dict]


def heldout(text: str) -> bool:
    """The fixed split: a function of the prompt's text only."""
    return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16) % HELDOUT_BUCKETS == 0


def _fill(rng: random.Random, template: str, tasks: list[str] = TASKS) -> str:
    topic, topic2 = rng.sample(TOPICS, 2)
    return template.format(verb=rng.choice(VERBS), topic=topic, topic2=topic2, style=rng.choice(STYLES),
                           lang=rng.choice(LANGUAGES), task=rng.choice(tasks), n=rng.choice(NUMBERS),
                           form=rng.choice(FORMS), noun=rng.choice(NOUNS))


def _draw_template(rng: random.Random, code_share: float | None) -> tuple[str, str]:
    if code_share is None:
        return TEMPLATES[rng.randrange(len(TEMPLATES))]
    code = [t for t in TEMPLATES if t[0] in CODE_CATEGORIES] + MORE_CODE
    rest = [t for t in TEMPLATES if t[0] not in CODE_CATEGORIES]
    pool = code if rng.random() < code_share else rest
    return pool[rng.randrange(len(pool))]


def generate(train: int, held_out: int, seed: int = 0, max_draws: int | None = None,
             code_share: float | None = None) -> GeneratedSet:
    """`train` prompts for data generation and `held_out` for the benchmark, distinct texts, in the
    order they were drawn; ids say the side and the draw (`gen<seed>-t00042`, `gen<seed>-h00007`).
    `code_share`: the chance that a draw asks for code (the code categories and MORE_CODE), for a code
    model's data; None draws every template alike (about 3 in 13 ask for code)."""
    if train < 1 or held_out < 1:
        raise ConfigError("make-prompts: --train and --heldout must be at least 1")
    if code_share is not None and not 0.0 <= code_share <= 1.0:
        raise ConfigError(f"make-prompts: --code-share {code_share} is not a share; give a number from 0 to 1")
    rng = random.Random(seed)
    seen: set[str] = set()
    out: dict[str, list[dict]] = {"train": [], "heldout": []}
    want = {"train": train, "heldout": held_out}
    draws, limit = 0, max_draws or 200 * (train + held_out)
    while len(out["train"]) < train or len(out["heldout"]) < held_out:
        draws += 1
        if draws > limit:
            raise ConfigError(f"make-prompts: only {len(seen)} distinct prompts after {limit} draws; ask for fewer "
                              f"(--train {train}, --heldout {held_out})")
        category, template = _draw_template(rng, code_share)
        text = _fill(rng, template, TASKS if code_share is None else TASKS + CODE_TASKS)
        if text in seen:
            continue
        seen.add(text)
        side = "heldout" if heldout(text) else "train"
        if len(out[side]) >= want[side]:
            continue
        tag = "h" if side == "heldout" else "t"
        out[side].append({"id": f"gen{seed}-{tag}{len(out[side]):05d}",
                          "conversations": [{"role": "user", "content": text}],
                          "category": category, "split": side})
    return GeneratedSet(out["train"], out["heldout"])


def write(directory: Path, generated: GeneratedSet) -> tuple[Path, Path]:
    """directory/train.jsonl and directory/heldout.jsonl, each written atomically."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = directory / "train.jsonl", directory / "heldout.jsonl"
    for path, rows in zip(paths, (generated.train, generated.heldout)):
        atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in rows))
    return paths
