#!/usr/bin/env python3
"""Greedy acceptance and decode speed of the demo models (models/README.md) on the held-out prompts
recorded by the training run, with `hyspec run` (python3 standard library only).

  scripts/measure_demo.py [--prompts 64] [--tokens 192] [--threads 2] [--adapt] [--hyspec build/hyspec[,B2...]]
                          [--backend cpu|cuda]

For each of none / mtp (draft-max 3) / mtp (draft-max 15) / dflash (block 16: draft-max 15) / ngram it
runs every prompt (given as token ids) and prints the pooled mean acceptance length ((accepted + rounds)
/ rounds, the engine's definition summed over prompts), decode tokens/s (generated tokens after the
first, over the decode time) and its ratio to plain decoding, and whether every speculative output
equals the plain greedy one. Without --adapt every round speculates with the full draft length
(--no-adapt). Several binaries (a comma list) take turns on every prompt and method, so an A/B of two
builds sees the same load on the machine.
"""
import argparse
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hyspec", default=os.path.join(ROOT, "build", "hyspec"), help="binary, or a comma list to compare")
    ap.add_argument("--models", default=os.path.join(ROOT, "models"))
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=192)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--adapt", action="store_true", help="let the engine adapt the draft length (its default)")
    ap.add_argument("--backend", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--run-args", default="", help="more arguments for every run (e.g. --no-graphs)")
    args = ap.parse_args()

    stats = json.load(open(os.path.join(args.models, "demo-training-stats.json")))
    prompts = stats["heldout_prompts"][: args.prompts]
    target = os.path.join(args.models, "qwen35-demo-q8_0.gguf")
    drafter = os.path.join(args.models, "qwen35-demo-dflash-q8_0.gguf")
    adapt = [] if args.adapt else ["--no-adapt"]
    methods = [("none", ["--spec", "none"]), ("mtp", ["--spec", "mtp", "--draft-max", "3"] + adapt),
               ("mtp15", ["--spec", "mtp", "--draft-max", "15"] + adapt),
               ("dflash", ["--spec", "dflash", "--draft-model", drafter, "--draft-max", "15"] + adapt),
               ("ngram", ["--spec", "ngram"] + adapt)]
    binaries = args.hyspec.split(",")
    outputs = {}
    totals = {(b, name): [0, 0, 0, 0.0] for b in binaries for name, _ in methods}  # rounds, accepted, generated, s
    print(f"{len(prompts)} held-out prompts of 64 tokens, {args.tokens} greedy tokens each, "
          f"{args.backend}, {args.threads} threads, {'adaptive' if args.adapt else 'fixed'} draft length")
    for i, p in enumerate(prompts):
        for name, extra in methods:  # the methods take turns, so load changes on the machine hit all alike
            for b in binaries if i % 2 == 0 else binaries[::-1]:
                cmd = [b, "run", "-m", target, "--tokens", ",".join(map(str, p["prompt_ids"])), "--ids",
                       "--temp", "0", "-n", str(args.tokens), "-t", str(args.threads),
                       "--backend", args.backend] + extra + args.run_args.split()
                r = subprocess.run(cmd, capture_output=True, text=True)
                if r.returncode != 0:
                    sys.exit(f"{' '.join(cmd)}\n{r.stderr}")
                outputs.setdefault((b, i), {})[name] = r.stdout.split()
                t = totals[(b, name)]
                m = re.search(r"generation: (\d+) tokens in ([\d.]+) s", r.stderr)
                t[2] += int(m.group(1)) - 1
                t[3] += float(m.group(2))
                m = re.search(r"(\d+) rounds, (\d+) drafted, (\d+) accepted", r.stderr)
                if m:
                    t[0] += int(m.group(1))
                    t[1] += int(m.group(3))
    status = 0
    for b in binaries:
        if len(binaries) > 1:
            print(f"== {b}")
        plain = totals[(b, "none")][2] / totals[(b, "none")][3]
        for name, _ in methods:
            rounds, accepted, generated, seconds = totals[(b, name)]
            mal = f"{(accepted + rounds) / rounds:.2f}" if rounds else "-"
            print(f"{name:7s} mean acceptance length {mal:>5s} ({rounds} rounds, {accepted} accepted), "
                  f"{generated / seconds:7.1f} tokens/s ({generated / seconds / plain:.3f}x plain)")
        differ = {n: sum(o[n] != o["none"] for (bb, _), o in outputs.items() if bb == b) for n, _ in methods[1:]}
        print("speculative outputs that differ from plain greedy:", differ)
        status |= any(differ.values())
    sys.exit(status)


if __name__ == "__main__":
    main()
