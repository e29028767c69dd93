#!/usr/bin/env python3
"""Prints a reproducible prompt of N random words (default 380) from a small
English list: the long prompt of the prefill benchmarks. On the bench preset
380 words make 1,004 tokens.

usage: scripts/long-prompt.py [N] > prompt.txt
"""
import random
import sys

WORDS = (
    "the of and to in is was for on that with as by at from his her they have had not but are this "
    "which one all were when we there can an been has more if will who their out so up about into "
    "than them some could time only other new would these two may first then do any like my now over "
    "such our man even most made after also did many before must through back years where much your "
    "way well down should because each just those people how too little state good very make world "
    "still own see men work long get here between both life being under never day same another know "
    "while last might us great old year off come since against go came right used take three"
).split()

random.seed(7)
count = int(sys.argv[1]) if len(sys.argv) > 1 else 380
print(" ".join(random.choice(WORDS) for _ in range(count)))
