#!/usr/bin/env python3
"""Writes a deterministic synthetic support-ticket corpus (one ticket per line) for the quickstart.
Standard library only: the product needs no Python; this script only makes example data."""
import argparse
import random

TOPICS = {
    "billing": ["I was charged twice for order {n}", "the invoice {n} shows the wrong amount",
                "please refund the payment for order {n}", "my card was billed after I cancelled"],
    "hardware": ["my printer {n} is jammed again", "the laptop screen flickers since update {n}",
                 "the keyboard on desk {n} stopped working", "router {n} keeps rebooting"],
    "account": ["I cannot log in to account {n}", "please reset the password for user {n}",
                "my account {n} was locked after three tries", "how do I change the email on account {n}"],
    "shipping": ["parcel {n} has not arrived yet", "the tracking number {n} shows no updates",
                 "order {n} arrived damaged", "can you change the delivery address for order {n}"],
}
URGENCY = ["low", "normal", "high", "urgent"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    with open(args.out, "w") as f:
        for _ in range(args.n):
            topic = rng.choice(sorted(TOPICS))
            text = rng.choice(TOPICS[topic]).format(n=rng.randint(100, 9999))
            if rng.random() < 0.3:
                text += ", " + rng.choice(["this is urgent", "no rush", "please help", "thanks"])
            f.write(f"Ticket: {text}. Topic: {topic}. Urgency: {rng.choice(URGENCY)}.\n")


if __name__ == "__main__":
    main()
