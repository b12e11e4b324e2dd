#!/usr/bin/python3
"""Loss curves of a training run (log.csv of train.py) as a PNG (needs python3-matplotlib,
used only here; nothing in the build or the tests needs it)."""
import argparse
import csv

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("csv")
    ap.add_argument("-o", required=True)
    ap.add_argument("--title", default="")
    a = ap.parse_args()
    rows = list(csv.DictReader(open(a.csv)))
    fig, ax = plt.subplots(1, 2, figsize=(11, 4))
    s1 = [(int(r["step"]), float(r["loss"])) for r in rows if r["phase"] == "1" and r["loss"]]
    h1 = [(int(r["step"]), float(r["held_loss"])) for r in rows if r["phase"] == "1" and r["held_loss"]]
    ax[0].plot(*zip(*s1), lw=0.8, label="training batch")
    if h1:
        ax[0].plot(*zip(*h1), "o-", label="held-out (8 k tokens)")
    ax[0].set_xlabel("step (8 x 256 tokens)")
    ax[0].set_ylabel("next-token loss (nats)")
    ax[0].set_title("backbone")
    ax[0].grid(alpha=0.3)
    ax[0].legend()
    s2 = [(int(r["step"]), float(r["draft_loss"])) for r in rows if r["phase"] == "2" and r["draft_loss"]]
    if s2:
        ax[1].plot(*zip(*s2), lw=0.8, label="draft loss (CE + distillation)")
        c2 = [(int(r["step"]), float(r["conf_loss"])) for r in rows if r["phase"] == "2" and r["conf_loss"]
              and float(r["conf_loss"]) > 0]
        if c2:
            ax[1].plot(*zip(*c2), lw=0.8, label="confidence BCE")
        s3 = [(int(r["step"]), float(r["draft_loss"])) for r in rows if r["phase"] == "3" and r["draft_loss"]]
        if s3:   # train.py --greedy-steps: the backbone's greedy text (kjv-v4's MTP)
            ax[1].plot(*zip(*s3), lw=0.8, label="greedy-text loss (train.py phase 3)")
        s4 = [(int(r["step"]), float(r["draft_loss"])) for r in rows if r["phase"] == "4" and r["draft_loss"]]
        if s4:   # make_model.sh --drafts-only: cross-entropy on the target's greedy text
            ax[1].plot(*zip(*s4), lw=0.8, label="greedy-text cross-entropy (train_drafts)")
        ax[1].set_xlabel("step")
        ax[1].set_title("draft blocks (backbone frozen)")
        ax[1].grid(alpha=0.3)
        ax[1].legend()
    if a.title:
        fig.suptitle(a.title)
    fig.tight_layout()
    fig.savefig(a.o, dpi=80)


if __name__ == "__main__":
    main()
