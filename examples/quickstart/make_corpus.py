#!/usr/bin/env python3
"""Writes the quickstart's deterministic synthetic support-ticket triage dataset.

Each ticket is free text of varied wording whose topic (billing / hardware / account / shipping)
and urgency (low / normal / high / urgent) follow from cue words in it; the answer to learn is
e.g. "topic: billing, urgency: high". Outputs, in --out DIR:
  train.json    2,000 alpaca records {instruction, input, output}
  eval.json     300 held-out records (no ticket text shared with train.json)
  corpus.txt    plain text for training the tokenizer (the tickets, answers and prompt words)
Standard library only: the product needs no Python; this script only makes example data."""
import argparse
import json
import os
import random

INSTRUCTION = "Triage this support ticket: give its topic and urgency."

# {n}: a number, {item}: a product word. Every template carries at least one topic cue word.
TOPICS = {
    "billing": [
        "I was charged twice for order {n}",
        "the invoice {n} shows the wrong amount",
        "please refund the payment for order {n}",
        "my card was billed after I cancelled the subscription",
        "why does my bill for {item} say {n} dollars",
        "the payment for invoice {n} failed but money left my account",
        "I need a receipt for the charge on order {n}",
        "you billed me for {item} which I never bought",
    ],
    "hardware": [
        "my printer {n} is jammed again",
        "the laptop screen flickers since update {n}",
        "the keyboard on desk {n} stopped working",
        "router {n} keeps rebooting",
        "the monitor in room {n} shows no picture",
        "my {item} makes a grinding noise and will not power on",
        "the battery of laptop {n} drains in an hour",
        "the mouse at station {n} is broken",
    ],
    "account": [
        "I cannot log in to account {n}",
        "please reset the password for user {n}",
        "my account {n} was locked after three tries",
        "how do I change the email on account {n}",
        "the login page rejects my password since yesterday",
        "I never got the verification code for user {n}",
        "please delete my profile and account {n}",
        "two factor login fails on my {item}",
    ],
    "shipping": [
        "parcel {n} has not arrived yet",
        "the tracking number {n} shows no updates",
        "order {n} arrived damaged in the delivery box",
        "can you change the delivery address for order {n}",
        "the courier left package {n} at the wrong door",
        "my {item} shipment is stuck in customs",
        "delivery of parcel {n} is two weeks late",
        "the package for order {n} was returned to sender",
    ],
}
ITEMS = ["tablet", "phone", "headset", "camera", "speaker", "charger", "scanner", "watch"]
URGENCY = {
    "low": ["no rush", "whenever you have time", "not important", "low priority, just curious"],
    "normal": ["", "please take a look", "could you check this", "let me know what you find"],
    "high": ["please fix this today", "this is blocking my work", "high priority please", "I need this soon"],
    "urgent": ["URGENT", "this is an emergency", "urgent, we are losing customers", "fix immediately, critical"],
}
OPENERS = ["", "Hi,", "Hello,", "Hello team,", "Good morning,", "Hey support,", "Dear support,"]
CLOSERS = ["", "Thanks.", "Thank you!", "Regards, Sam", "Best, Ana", "Cheers", "Kind regards, Lee"]


def ticket(rng):
    """One ticket: (text, topic, urgency)."""
    topic = rng.choice(sorted(TOPICS))
    urgency = rng.choice(sorted(URGENCY))
    body = rng.choice(TOPICS[topic]).format(n=rng.randint(100, 9999), item=rng.choice(ITEMS))
    cue = rng.choice(URGENCY[urgency])
    parts = [rng.choice(OPENERS)]
    if cue and rng.random() < 0.5:
        parts += [cue[0].upper() + cue[1:] + ":", body + "."]
    else:
        parts += [body[0].upper() + body[1:] + ("." if not cue else ", " + cue + ".")]
    parts.append(rng.choice(CLOSERS))
    return " ".join(p for p in parts if p), topic, urgency


def record(text, topic, urgency):
    return {"instruction": INSTRUCTION, "input": text, "output": f"topic: {topic}, urgency: {urgency}"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--train", type=int, default=2000)
    ap.add_argument("--eval", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    os.makedirs(args.out, exist_ok=True)
    train, seen = [], set()
    while len(train) < args.train:
        t = ticket(rng)
        seen.add(t[0])
        train.append(record(*t))
    held = []
    while len(held) < args.eval:
        t = ticket(rng)
        if t[0] not in seen:  # held-out tickets never appear verbatim in train
            seen.add(t[0])
            held.append(record(*t))
    for name, recs in (("train.json", train), ("eval.json", held)):
        with open(os.path.join(args.out, name), "w") as f:
            json.dump(recs, f, indent=1)
            f.write("\n")
    with open(os.path.join(args.out, "corpus.txt"), "w") as f:
        for r in train:
            f.write(f"{r['instruction']}\n{r['input']}\n{r['output']}\n")
        # the alpaca template's fixed words, so they become few tokens
        f.write("Below is an instruction that describes a task. "
                "Write a response that appropriately completes the request.\n"
                "### Instruction:\n### Input:\n### Response:\n" * 50)


if __name__ == "__main__":
    main()
