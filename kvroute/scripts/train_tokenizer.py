"""Train kvroute's built-in byte-level BPE tokenizer (router/contract/data/tokenizer.json).

A one-off: the file is committed and the runtime only loads it. Reproduce it with

    python -m kvroute.scripts.train_tokenizer --out router/contract/data/tokenizer.json

and check a fresh run against the committed file with

    python -m kvroute.scripts.train_tokenizer --check

The corpus is text already on the build machine, read in sorted order, deduplicated
by content, each file cut at 64 KiB, each source capped:

    code   Python standard library *.py (the running interpreter's, tests excluded), 5 MiB
    prose  /usr/share/common-licenses/* and /usr/share/doc/**/{README*,*.md,*.txt,*.rst,
           copyright} (uncompressed), 5 MiB

Byte-identical output needs the same files, so the same image (Python 3.11.7 on the
project's Debian base); the script prints a digest of the corpus to compare.
Vocabulary: 8192 ids, including 256 byte symbols and the special tokens
<|pad|> <|bos|> <|eos|> <|im_start|> <|im_end|> at ids 0..4.

The other files of router/contract/data/ (tokenizer_config.json, generation_config.json,
chat_template.jinja) are written by hand: together they make router/contract/data/ a Hugging Face
style model directory, loaded by router/contract/tokenizer.py like any other.
"""

from __future__ import annotations

import argparse
import hashlib
import pathlib
import sys
import sysconfig
import time

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from kvroute.router.contract.tokenizer import DATA_DIR

VOCAB_SIZE = 8192
SPECIAL_TOKENS = ["<|pad|>", "<|bos|>", "<|eos|>", "<|im_start|>", "<|im_end|>"]
MAX_FILE_BYTES = 64 * 1024
SOURCE_CAP_BYTES = 5 * 1024 * 1024
DOC_NAMES = ("copyright",)
DOC_SUFFIXES = (".md", ".txt", ".rst")
DEFAULT_OUT = DATA_DIR / "tokenizer.json"


def _code_files() -> list[pathlib.Path]:
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    skip = {"test", "tests", "idle_test", "site-packages", "lib2to3"}
    files = [p for p in root.rglob("*.py") if not skip & set(p.relative_to(root).parts)]
    return sorted(files)


def _is_doc(p: pathlib.Path) -> bool:
    name = p.name
    return name in DOC_NAMES or name.upper().startswith("README") or p.suffix in DOC_SUFFIXES


def _prose_files() -> list[pathlib.Path]:
    licenses = sorted(pathlib.Path("/usr/share/common-licenses").glob("*"))
    docs = sorted(p for p in pathlib.Path("/usr/share/doc").rglob("*") if _is_doc(p))
    return licenses + docs


def _read_capped(files: list[pathlib.Path], seen: set[str]) -> list[str]:
    texts, total = [], 0
    for path in files:
        if not path.is_file() or path.is_symlink():
            continue
        try:
            text = path.read_bytes()[:MAX_FILE_BYTES].decode("utf-8", errors="ignore")
        except OSError:
            continue
        digest = hashlib.sha256(text.encode()).hexdigest()
        if not text.strip() or digest in seen:
            continue
        seen.add(digest)
        texts.append(text)
        total += len(text.encode())
        if total >= SOURCE_CAP_BYTES:
            break
    return texts


def corpus() -> list[str]:
    seen: set[str] = set()
    return _read_capped(_code_files(), seen) + _read_capped(_prose_files(), seen)


def train(texts: list[str]) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return tok


def build() -> str:
    texts = corpus()
    size = sum(len(t.encode()) for t in texts)
    h = hashlib.sha256("\x00".join(texts).encode()).hexdigest()
    print(f"corpus: {len(texts)} files, {size / 2**20:.2f} MiB, sha256 {h}", file=sys.stderr)
    t0 = time.perf_counter()
    tok = train(texts)
    print(f"trained in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    if tok.get_vocab_size(with_added_tokens=True) != VOCAB_SIZE:
        raise SystemExit(f"vocab size {tok.get_vocab_size()} != {VOCAB_SIZE}")
    for i, s in enumerate(SPECIAL_TOKENS):
        if tok.token_to_id(s) != i:
            raise SystemExit(f"special token {s} is not id {i}")
    return tok.to_str(pretty=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT)
    ap.add_argument("--check", action="store_true", help="compare with --out instead of writing it")
    args = ap.parse_args(argv)
    text = build()
    digest = hashlib.sha256(text.encode()).hexdigest()
    if args.check:
        same = args.out.read_text(encoding="utf-8") == text
        print(f"{'identical to' if same else 'DIFFERS from'} {args.out} (sha256 {digest})")
        return 0 if same else 1
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out}: {len(text.encode())} bytes, sha256 {digest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
