"""`streamer keys`: make and list the CURVE key pairs that guard a published stream.

A publisher bound beyond loopback needs its own pair (`generate server`) and
the public keys of the clients it lets in; each client has its own pair and
the server's public key. Public halves (NAME.key) may be copied anywhere;
secret halves (NAME.key_secret) stay with their owner.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from streamer.publish.security import default_key_dir, generate_keypair, load_keys

NAME = "keys"
HELP = "generate or list CURVE key pairs for the ZeroMQ stream"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dir", type=Path, default=None, help=f"key directory (default {default_key_dir()})")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    gen = actions.add_parser("generate", help="write NAME.key and NAME.key_secret")
    gen.add_argument("name", help="whose keys: 'server', or a client's name")
    actions.add_parser("list", help="name, public key and whether the secret half is here")


def run(args: argparse.Namespace) -> int:
    directory = args.dir or default_key_dir()
    if args.action == "generate":
        public, secret = generate_keypair(directory, args.name)
        print(f"{args.name}\t{load_keys(public).public.decode()}\t{public}\t{secret}")
        return 0
    keys = sorted(directory.glob("*.key"))
    if not keys:
        print(f"no keys in {directory}: make one with `streamer keys generate NAME`", file=sys.stderr)
    for path in keys:
        secret = path.with_suffix(".key_secret")
        print(f"{path.stem}\t{load_keys(path).public.decode()}\t{'secret' if secret.exists() else 'public only'}")
    return 0
