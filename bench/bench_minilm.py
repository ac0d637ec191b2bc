"""What the MiniLM testbed costs on this CPU, and which frozen head it should use.

    .venv/bin/python bench/bench_minilm.py                       # everything below, 1 thread
    .venv/bin/python bench/bench_minilm.py --parts load throughput
    .venv/bin/python bench/bench_minilm.py --parts heads --tasks spam party
    .venv/bin/python bench/bench_minilm.py --parts finetune --ft-tasks spam party --steps 60

Parts (each appends records to its file, replacing the records of the same part):

- ``load`` -> ``book/data/minilm_timing.jsonl``: seconds to import transformers, to read θ0
  (``AutoModel.from_pretrained`` offline, 22.6 M parameters) and the tokenizer, and to tokenize.
- ``throughput`` -> same file: evaluation sequences/s of θ0 (mean-pooled features, no grad) on
  real validation texts of every task, at 16 and 32 tokens, in batches of 128.
- ``steps`` -> same file: seconds per fine-tuning step (full, LoRA) by batch size and token budget.
- ``heads`` -> ``book/data/minilm_heads.jsonl``: validation accuracy at θ0 of the three heads
  (``Recipe.head``): ``prompt`` (class descriptions, zero-shot), ``prototype`` (class means of
  ``--head-train`` train examples), ``probe`` (logistic regression on them).
- ``prompts`` -> ``book/data/minilm_heads.jsonl``: validation accuracy at θ0 of the prompt head
  with each wording of :data:`PROMPT_VARIANTS` (how the descriptions in use were picked).
- ``merge`` -> same file: on ``minilm-8`` built from the finetune part's zoo, the seconds of
  loading the testbed, of one evaluation of the capped val split, and of a Task Arithmetic and a
  TSV-M run (``--alphas`` α values on val, then test), with their normalized accuracy.
- ``finetune`` -> ``book/data/minilm_timing.jsonl``: full and LoRA fine-tunes of ``--ft-tasks``
  (seed 0, ``--steps`` steps, the default recipe otherwise) in a zoo of their own
  (``$PACT_CACHE/zoo-minilm-bench``): seconds per run and per step, zero-shot vs fine-tuned val and
  test accuracy, and evaluation seconds.

Threads: ``torch.set_num_threads(--threads)`` (default 1: the book runs two 1-thread kernels).
"""
from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path

import torch

from pactlib.book import records

PARTS = ("load", "throughput", "steps", "heads", "prompts", "finetune", "merge")

#: Why the testbed's heads are prompt heads (the ``head_decision`` record carries this text).
HEAD_DECISION = (
    "The zoo's heads are prompt heads (Recipe.head='prompt'): each class direction is θ0's mean-pooled "
    "embedding of one English description of the class, the construction of CLIP's zero-shot head that "
    "the paper's task vectors are fine-tuned through, so zero-shot accuracy is a real zero-shot "
    "accuracy. Prototype (class means of train features) and probe (logistic regression) heads are "
    "stronger at θ0 on most tasks, but they are trained on the task's labelled data: the zero-shot "
    "row would then be a linear probe, close to fine-tuned accuracy, and leave little of the gap that "
    "merging is measured in; on Lite0 a probe head also made Task Arithmetic barely beat zero-shot "
    "(book/data/head_choice.jsonl). Fine-tuning through the prompt head beats its zero-shot accuracy "
    "on every task measured (book/data/minilm_timing.jsonl, part finetune).")

#: Wordings of the class descriptions tried on the validation split (part ``prompts``): the first of
#: each list is the first one written; ``pactlib.data.text.tasks`` keeps the best where the first
#: scored at or below chance (spam, subjectivity, gloss_pos); party and debate_speaker stay near
#: chance with every wording (their prototype and probe heads do too: hard tasks for θ0).
PROMPT_VARIANTS = {
    "spam": [("an ordinary personal or mailing-list email", "an unsolicited commercial spam email advertising something"),
             ("a technical discussion on a mailing list", "an advertisement offering money, products or deals"),
             ("an email from a friend or colleague", "spam: buy now, free offer, make money fast, click here"),
             ("a reply in an email discussion about software or news", "a marketing email selling a product or service")],
    "subjectivity": [("an objective summary of what happens in a movie's plot", "a subjective critic's opinion of a movie"),
                     ("the story of a film: who the characters are and what happens to them",
                      "a critic's judgement of how good or bad a film is"),
                     ("a plot synopsis", "a movie review")],
    "party": [("a sentence from a speech by a Democratic politician", "a sentence from a speech by a Republican politician"),
              ("Democrats: Obama, Medicare, the middle class, women's rights, unions",
               "Republicans: Romney, lower taxes, small government, free enterprise, job creators"),
              ("a speech at the 2012 Democratic National Convention supporting Barack Obama",
               "a speech at the 2012 Republican National Convention supporting Mitt Romney")],
    "debate_speaker": [tuple(f"something {n} said in a 2016 {'vice-' if n in ('Mike Pence', 'Tim Kaine') else ''}"
                             "presidential debate" for n in ("Donald Trump", "Hillary Clinton", "Mike Pence", "Tim Kaine")),
                       ("Donald Trump: believe me, tremendous, a disaster, we will make America great again",
                        "Hillary Clinton: my plan, families, I have a plan, we need to invest",
                        "Mike Pence: Governor of Indiana, Donald Trump and I will",
                        "Tim Kaine: Senator from Virginia, Hillary Clinton and I")],
    "gloss_pos": [tuple(f"the dictionary definition of {p}" for p in ("a noun", "a verb", "an adjective", "an adverb")),
                  ("a thing or a person: a type of object", "to do something: an action",
                   "having a quality; describing something", "in a certain manner; -ly")],
}


def _common(args) -> dict:
    return dict(threads=torch.get_num_threads(), torch=torch.__version__.split("+")[0], machine=platform.machine(),
                cpus=os.cpu_count(), load_avg=round(os.getloadavg()[0], 2))


def part_load(args) -> list[dict]:
    t0 = time.perf_counter()
    import transformers  # noqa: F401
    from transformers import BertModel  # noqa: F401  (the lazy import of the model code)
    t_import = time.perf_counter() - t0
    from pactlib.testbeds.minilm.model import load_pretrained, load_tokenizer, tokenize
    from pactlib.data.text import load_text_task

    t0 = time.perf_counter()
    sd, cfg = load_pretrained()
    t_model = time.perf_counter() - t0
    t0 = time.perf_counter()
    tok = load_tokenizer()
    t_tok = time.perf_counter() - t0
    texts = [t for n in ("spam", "party", "noun_supersense", "language") for t in load_text_task(n, "val").texts]
    t0 = time.perf_counter()
    tokenize(tok, texts, 32)
    t_tokenize = time.perf_counter() - t0
    n_params = sum(v.numel() for v in sd.values())
    print(f"import transformers {t_import:.1f}s, θ0 {t_model:.2f}s ({n_params / 1e6:.1f} M), tokenizer {t_tok:.2f}s, "
          f"tokenize {len(texts)} texts {t_tokenize:.2f}s")
    return [records.make_record("load", params={}, seed=None, part="load",
                                metrics=dict(import_seconds=t_import, model_seconds=t_model, tokenizer_seconds=t_tok,
                                             tokenize_seconds=t_tokenize, tokenize_texts=len(texts),
                                             parameters=n_params), **_common(args))]


def part_throughput(args) -> list[dict]:
    from pactlib.data.text import TEXT_SUITES, load_text_task
    from pactlib.testbeds.minilm.model import build_encoder, encode, load_pretrained, load_tokenizer, tokenize

    sd, cfg = load_pretrained()
    model = build_encoder(cfg, sd)
    tok = load_tokenizer()
    texts = [t for n in TEXT_SUITES["14"] for t in load_text_task(n, "val", limit=args.per_task).texts]
    out = []
    for L in args.tokens:
        x = tokenize(tok, texts, L)
        encode(model, x[:128])  # warm-up
        t0 = time.perf_counter()
        encode(model, x, 128)
        dt = time.perf_counter() - t0
        mean_len = float(x[:, 1].sum(1).float().mean())
        print(f"max_tokens {L}: {len(texts) / dt:.0f} seq/s (mean length {mean_len:.1f} tokens, {len(texts)} texts)")
        out.append(records.make_record("throughput", params=dict(max_tokens=L, batch=128), seed=None,
                                       part="throughput", metrics=dict(seq_per_s=len(texts) / dt, seconds=dt,
                                                                       texts=len(texts), mean_tokens=mean_len),
                                       **_common(args)))
    return out


def part_steps(args) -> list[dict]:
    """Seconds per optimizer step of full and LoRA fine-tuning, by batch size and token budget
    (``--step-count`` steps after one warm-up step, on spam's train texts, which fill the budget)."""
    from pactlib.data.text import load_text_task
    from pactlib.testbeds.minilm import zoo as Z
    from pactlib.testbeds.minilm.model import build_encoder, encode, load_pretrained, load_tokenizer, tokenize

    sd, cfg = load_pretrained()
    tok = load_tokenizer()
    d = load_text_task("spam", "train", limit=512)
    model = build_encoder(cfg, sd)
    out = []
    for L in args.tokens:
        x = tokenize(tok, d.texts, L)
        prompts = encode(model, tokenize(tok, list(d.prompts), L))
        head = Z.fit_prompt_head(prompts, None, d.labels, d.classes)
        for kind in args.kinds:
            for bs in args.batches:
                recipe = Z.Recipe(steps=args.step_count + 1, batch_size=bs, warmup=1, max_tokens=L)
                fn = Z.finetune_full if kind == "full" else Z.finetune_lora
                g = torch.Generator().manual_seed(0)
                t0 = time.perf_counter()
                fn(sd, cfg, head, x, d.labels, recipe=recipe, generator=g)
                dt = (time.perf_counter() - t0) / recipe.steps
                print(f"{kind:4s} batch {bs:3d} max_tokens {L}: {dt:.3f} s/step (mean length "
                      f"{float(x[:, 1].sum(1).float().mean()):.1f} tokens)")
                out.append(records.make_record("step_time", params=dict(kind=kind, batch_size=bs, max_tokens=L,
                                                                        lora_targets="all", lora_rank=8), seed=0,
                                               part="steps", metrics=dict(seconds_per_step=dt, steps=recipe.steps),
                                               **_common(args)))
    return out


def part_heads(args) -> list[dict]:
    from pactlib.data.text import TEXT_SUITES, load_text_task
    from pactlib.testbeds.minilm import zoo as Z
    from pactlib.testbeds.zoo_trainer import TaskSplits
    from pactlib.testbeds.minilm.model import build_encoder, encode, load_pretrained, load_tokenizer, tokenize

    sd, cfg = load_pretrained()
    model = build_encoder(cfg, sd)
    tok = load_tokenizer()
    out = []
    for task in args.tasks or TEXT_SUITES["14"]:
        t0 = time.perf_counter()
        recipe = Z.Recipe(train_limit=args.head_train, eval_limit=args.head_val)
        data = TaskSplits(Z.MiniLMZoo(Z.Source(tokenizer=tok)), task, load_text_task, recipe)
        xv, yv = data.inputs("val")
        fv = encode(model, xv)
        accs = {}
        for head in Z.HEADS:
            h = Z.fit_task_head(head, model, data, recipe)
            accs[head] = float((h.logits(fv).argmax(1) == yv).double().mean())
        k = len(data.split("val").classes)
        chance = float(torch.bincount(yv).max()) / len(yv)
        print(f"{task:18s} prompt {accs['prompt']:.3f}  prototype {accs['prototype']:.3f}  probe {accs['probe']:.3f}  "
              f"(majority {chance:.3f}, {k} classes, {time.perf_counter() - t0:.0f}s)")
        out.append(records.make_record("head_choice", params=dict(head_train=args.head_train, head_val=args.head_val,
                                                                  max_tokens=recipe.max_tokens), seed=None,
                                       part="heads", task=task, classes=k,
                                       metrics=dict(**{f"val_acc:{h}": a for h, a in accs.items()}, majority=chance),
                                       **_common(args)))
    means = {h: sum(r["metrics"][f"val_acc:{h}"] for r in out) / len(out) for h in Z.HEADS}
    print("mean val accuracy at θ0: " + ", ".join(f"{h} {a:.3f}" for h, a in means.items()))
    out.append(records.make_record("head_decision", params=dict(head_train=args.head_train, head_val=args.head_val),
                                   seed=None, part="heads", chosen=Z.Recipe().head, note=HEAD_DECISION,
                                   tasks=[r["task"] for r in out],
                                   metrics={f"mean_val_acc:{h}": a for h, a in means.items()}, **_common(args)))
    return out


def part_prompts(args) -> list[dict]:
    import torch.nn.functional as F

    from pactlib.data.text import TEXT_TASKS, load_text_task
    from pactlib.testbeds.minilm.model import build_encoder, encode, load_pretrained, load_tokenizer, tokenize

    sd, cfg = load_pretrained()
    model = build_encoder(cfg, sd)
    tok = load_tokenizer()
    out = []
    for task, variants in PROMPT_VARIANTS.items():
        d = load_text_task(task, "val")
        f = F.normalize(encode(model, tokenize(tok, d.texts, 32)), dim=1)
        for i, v in enumerate(variants):
            P = F.normalize(encode(model, tokenize(tok, list(v), 32)), dim=1)
            acc = float(((f @ P.T).argmax(1) == d.labels).double().mean())
            chosen = tuple(v) == TEXT_TASKS[task].prompts
            print(f"{task:15s} wording {i} val {acc:.3f}{'  (in use)' if chosen else ''}  {v[0][:60]!r}")
            out.append(records.make_record("prompt_wording", params=dict(prompts=list(v), max_tokens=32), seed=None,
                                           part="prompts", task=task, wording=i, in_use=chosen,
                                           metrics={"val_acc:prompt": acc}, **_common(args)))
    return out


def part_finetune(args) -> list[dict]:
    from pactlib.paths import cache_dir
    from pactlib.testbeds.minilm import zoo as Z

    over = {k: v for k, v in (("batch_size", args.batch_size), ("lr", args.lr)) if v is not None}
    recipe = Z.Recipe(steps=args.steps, warmup=max(1, args.steps // 10), **over)
    zoo_dir = cache_dir("zoo-minilm-bench")
    out = []
    t0 = time.perf_counter()
    recs = Z.build_zoo(args.ft_tasks, [0], kind=args.kinds, zoo_dir=zoo_dir, recipe=recipe, progress=False)
    for r in recs:
        head = Z.read_json(Z.head_path(zoo_dir, r["task"]).with_suffix(".json"))
        print(f"{r['kind']:4s} {r['task']:18s} {r['train_seconds']:6.1f}s train ({r['train_seconds'] / args.steps:.2f} "
              f"s/step), eval {r['eval_seconds']:.1f}s/{r['n_eval']}  zero-shot val {r['zero_shot']['val']:.3f} test "
              f"{r['zero_shot']['test']:.3f} -> fine-tuned val {r['finetuned']['val']:.3f} test {r['finetuned']['test']:.3f}")
        out.append(records.make_record(
            "finetune", params=dict(recipe=r["recipe"]), seed=int(r["seed"]), part="finetune", task=r["task"],
            kind=r["kind"], metrics=dict(train_seconds=r["train_seconds"], seconds_per_step=r["train_seconds"] / args.steps,
                                         eval_seconds=r["eval_seconds"], n_eval=r["n_eval"],
                                         head_seconds=head["seconds"] if head else None,
                                         zs_val=r["zero_shot"]["val"], zs_test=r["zero_shot"]["test"],
                                         ft_val=r["finetuned"]["val"], ft_test=r["finetuned"]["test"],
                                         first_loss=r["first_loss"], final_loss=r["final_loss"]),
            **_common(args)))
    print(f"zoo {time.perf_counter() - t0:.0f}s in all (finished runs are reused: delete {zoo_dir} to time them again)")
    return out


def part_merge(args) -> list[dict]:
    """What one merge costs on ``minilm-<suite>`` (the finetune part's zoo, seed 0, full): loading the
    testbed (tokenizing the capped splits, measuring acc_ft / zero-shot, memoised after the first
    time), Task Arithmetic and TSV-M over ``--alphas`` α values chosen on val (``--val-limit``
    texts per task), then test on the whole test split, without the run memo."""
    from pactlib import testbeds
    from pactlib.paths import cache_dir
    from pactlib.testbeds.minilm.testbed import MiniLMTestbed

    zoo_dir = cache_dir("zoo-minilm-bench")
    out = []
    t0 = time.perf_counter()
    tb = MiniLMTestbed.from_zoo(f"minilm-{args.suite}", args.suite, 0, "full", zoo_dir=zoo_dir,
                                val_limit=args.val_limit, test_limit=None)
    t_load = time.perf_counter() - t0
    n_val = sum(len(tb.val[t][1]) for t in tb.tasks)
    n_test = sum(len(tb.test[t][1]) for t in tb.tasks)
    t0 = time.perf_counter()
    tb.evaluate(tb.pretrained, "val")
    t_eval_val = time.perf_counter() - t0
    print(f"minilm-{args.suite}: load {t_load:.1f}s; one evaluation of val ({n_val} texts) {t_eval_val:.1f}s; "
          f"test has {n_test} texts")
    for method in ("task_arithmetic", "tsv_m"):
        t0 = time.perf_counter()
        rec = testbeds.run(tb, method, alphas=testbeds.alpha_grid(method, args.alphas), memo=False)
        dt = time.perf_counter() - t0
        print(f"  {method:16s} {dt:6.1f}s (merge {rec['merge_seconds']:.1f}s), α={rec['alpha']}, "
              f"norm_acc {rec['metrics']['norm_acc']:.3f}, acc {rec['metrics']['acc']:.3f}")
        out.append(records.make_record("merge_cost", params=dict(method=method, alphas=args.alphas,
                                                                 val_limit=args.val_limit), seed=0, part="merge",
                                       testbed=tb.name, metrics=dict(seconds=dt, merge_seconds=rec["merge_seconds"],
                                                                     load_seconds=t_load, eval_val_seconds=t_eval_val,
                                                                     val_texts=n_val, test_texts=n_test,
                                                                     norm_acc=rec["metrics"]["norm_acc"],
                                                                     acc=rec["metrics"]["acc"], alpha=rec["alpha"]),
                                       **_common(args)))
    zs, ft = testbeds.reference_records(tb)
    print(f"  zero-shot acc {zs['metrics']['acc']:.3f} (normalized {zs['metrics']['norm_acc']:.3f}), "
          f"fine-tuned acc {ft['metrics']['acc']:.3f}")
    out += [dict(r, part="merge", **_common(args)) for r in (zs, ft)]
    return out


def _write(path: str, part: str, recs: list[dict]) -> None:
    path = Path(path)
    keep = [r for r in records.read_records(path) if r.get("part") != part] if path.exists() else []
    records.write_records(path, keep + recs, replace=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--tokens", type=int, nargs="+", default=[16, 32])
    p.add_argument("--per-task", type=int, default=64, help="throughput: val texts per task")
    p.add_argument("--tasks", nargs="+", default=None, help="heads: tasks (default suite 14)")
    p.add_argument("--head-train", type=int, default=512, help="heads: train examples per task")
    p.add_argument("--head-val", type=int, default=300, help="heads: val examples per task")
    p.add_argument("--ft-tasks", nargs="+", default=["spam", "party"])
    p.add_argument("--kinds", nargs="+", default=["full", "lora"])
    p.add_argument("--steps", type=int, default=100, help="finetune: steps per run")
    p.add_argument("--batch-size", type=int, default=None, help="finetune: batch size (default: the recipe's)")
    p.add_argument("--lr", type=float, default=None, help="finetune: full fine-tune lr (default: the recipe's)")
    p.add_argument("--batches", type=int, nargs="+", default=[16, 32], help="steps: batch sizes")
    p.add_argument("--step-count", type=int, default=8, help="steps: timed steps per setting")
    p.add_argument("--suite", default="8", help="merge: the suite")
    p.add_argument("--alphas", type=int, default=5, help="merge: α values (geometric grid)")
    p.add_argument("--val-limit", type=int, default=128, help="merge: val texts per task")
    p.add_argument("--timing-out", default="book/data/minilm_timing.jsonl")
    p.add_argument("--heads-out", default="book/data/minilm_heads.jsonl")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    for part in args.parts:
        recs = globals()[f"part_{part}"](args)
        _write(args.heads_out if part in ("heads", "prompts") else args.timing_out, part, recs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
