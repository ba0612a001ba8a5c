"""The `streamer` command: one sub-command per module in `streamer.commands`, plus those that
installed packages register in the `streamer.commands` entry-point group (`streamer.registry`:
a plugin's command without the core importing the plugin; a core command keeps its name).

Each command module defines `NAME`, `HELP`, `add_arguments(parser)` and `run(args) -> int`.
Errors that streamer raises on purpose print one line and exit non-zero; set
`STREAMER_DEBUG=1` to see the traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import pkgutil
import shutil
import sys
from typing import NoReturn

import streamer
import streamer.commands
from streamer import registry
from streamer.pipeline import cuda_start, warmup
from streamer.errors import ConfigError, StreamerError, UsageError, interrupted

EXIT_CONFIG = 78  # EX_CONFIG from sysexits.h: systemd units do not restart on it


def _command_modules():
    for info in sorted(pkgutil.iter_modules(streamer.commands.__path__), key=lambda i: i.name):
        if not info.name.startswith("_"):
            yield importlib.import_module(f"streamer.commands.{info.name}")


def _core_command(name: str):
    """The core command module `name` names (a dash in it an underscore in the module's), or None."""
    module = name.replace("-", "_")
    if module.startswith("_") or module not in {i.name for i in pkgutil.iter_modules(streamer.commands.__path__)}:
        return None
    mod = importlib.import_module(f"streamer.commands.{module}")
    return mod if mod.NAME == name else None


def _plugin_command_modules(taken: set[str]):
    for name in registry.names(registry.COMMANDS):
        if name in taken:
            continue
        try:
            yield registry.load(registry.COMMANDS, name)
        except ImportError as exc:  # a broken plugin costs its own command, not the others
            print(f"streamer: command {name!r} is unavailable: {exc}", file=sys.stderr)


OWN_LOGGERS = ("streamer", "streamer_gpu", "streamer_plugins")


class _Short(logging.Formatter):
    """A plain line for information, the level in front of anything worse."""

    def format(self, record: logging.LogRecord) -> str:
        line = record.getMessage()
        if record.levelno >= logging.WARNING:
            line = f"{record.levelname.lower()}: {line}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class _Stderr(logging.StreamHandler):
    """Writes to whatever sys.stderr is when a line is logged, not to the stream of the moment it was made."""

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


def configure_logging(verbose: int = 0, quiet: bool = False) -> None:
    """streamer's own lines at INFO, short (a journal adds the time); other libraries' at WARNING.

    numba and numba-cuda log bytecode dumps and every device free at DEBUG/INFO, watchdog and
    asyncio their internals: those show only with -vv.
    """
    handler = _Stderr()
    handler.setFormatter(logging.Formatter("[%(asctime)s %(name)s] %(levelname)s: %(message)s") if verbose
                         else _Short())  # fmt: skip
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if verbose >= 2 else logging.WARNING)
    own = logging.WARNING if quiet else logging.DEBUG if verbose else logging.INFO
    for name in OWN_LOGGERS:
        logging.getLogger(name).setLevel(own)


def build_parser(command: str = "") -> argparse.ArgumentParser:
    """The parser of every command; with `command` a core command's name, of that command alone, so that
    a run imports what it needs and not every other command's libraries (a tenth of a second on 2 cores)."""
    parser = argparse.ArgumentParser(prog="streamer", description=streamer.__doc__)
    parser.add_argument("--version", action="version", version=f"streamer {streamer.__version__}")
    noise = parser.add_mutually_exclusive_group()
    noise.add_argument("-v", "--verbose", action="count", default=0,
                       help="-v: streamer's debug lines, timestamped and named; -vv: every library's too")
    noise.add_argument("-q", "--quiet", action="store_true", help="warnings and errors only")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    alone = _core_command(command) if command else None
    if alone is not None:
        mods = [alone]
    else:
        core = list(_command_modules())
        mods = core + list(_plugin_command_modules({m.NAME for m in core}))
    for mod in mods:
        p = sub.add_parser(mod.NAME, help=mod.HELP, description=mod.HELP)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run, _parser=p)
    return parser


EXIT_USAGE = 2  # the command line is wrong, as argparse exits
EXIT_FAILED = 1  # the run could not be done: an input missing, unreadable or malformed, an output not writable
EXIT_INTERRUPTED = 130  # Ctrl-C, as a shell reports it


def main(argv: list[str] | None = None) -> int:
    """Exit status: 0 done, 1 the run failed, 2 a usage error, 78 an invalid daemon configuration,
    130 interrupted. Each failure is one line on stderr (`STREAMER_DEBUG=1` adds the traceback)."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        return _main(argv)
    except BaseException as exc:  # Ctrl-C; a command may say how to go on (`call --resume`)
        if not interrupted(exc):
            raise
        message = str(exc) if isinstance(exc, KeyboardInterrupt) and str(exc) else "interrupted"
        return _fail(_command_of(argv), message, EXIT_INTERRUPTED)


def console() -> NoReturn:
    """`streamer` as a program: main's exit status, without the interpreter's teardown once the command
    has closed its outputs (freeing numba's compiled code, the GPU context and every module's objects
    took 0.3 s on 2 cores and 0.9 s on a GPU box after the last output was written)."""
    code = main()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    _remove_process_folder()
    os._exit(code)


def _remove_process_folder() -> None:
    """The temporary folder multiprocessing made for this process (the readers' fork server's socket), which
    its exit handlers would have removed: without them each run would leave one in the system's temp folder."""
    process = sys.modules.get("multiprocessing.process")
    folder = process.current_process()._config.get("tempdir") if process is not None else None
    if folder:
        shutil.rmtree(folder, ignore_errors=True)


def _main(argv: list[str]) -> int:
    if argv == ["--version"]:  # without importing every command (numba, pod5...): a tenth of the time
        print(f"streamer {streamer.__version__}")
        return 0
    cuda_start.start(_command_of(argv), argv)  # the driver's start beside the imports that follow
    compiling = _first_run_notice(argv)
    try:
        args, unknown = build_parser(_command_of(argv)).parse_known_args(argv)
    except UsageError as exc:  # a flag's value, checked as it is parsed
        return _fail(_command_of(argv), exc, EXIT_USAGE)
    if unknown:  # the command's own usage, not the list of commands
        args._parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    configure_logging(args.verbose, args.quiet)
    args.compiling_kernels = compiling
    if args.command in warmup.COMMANDS:
        warmup.load_without_registries()
    if streamer.CACHE_DIR is not None:
        logging.getLogger("streamer").info("compiled kernels are cached in %s (the install folder is read-only)",
                                           streamer.CACHE_DIR)  # fmt: skip
    try:
        return args._run(args)
    except ConfigError as exc:
        return _fail(args.command, f"configuration error: {exc}", EXIT_CONFIG)
    except UsageError as exc:
        return _fail(args.command, exc, EXIT_USAGE)
    except StreamerError as exc:
        return _fail(args.command, exc, EXIT_FAILED)
    except OSError as exc:  # a file the checks could not foresee (removed meanwhile, disk full)
        where = f"{exc.filename}: " if exc.filename else ""
        return _fail(args.command, f"{where}{exc.strerror or exc}", EXIT_FAILED)


def _first_run_notice(argv: list[str]) -> bool:
    """Before the commands are imported (numba, pod5: seconds on a busy machine), say that a
    pipeline's first run on this machine compiles its kernels; True when it does."""
    command = _command_of(argv)
    if command not in warmup.COMMANDS:
        return False
    front = argv[: argv.index(command)]
    configure_logging(sum(a.count("v") for a in front if a.startswith("-v") or a == "--verbose"),
                      "-q" in front or "--quiet" in front)
    return warmup.announce_compile(logging.getLogger("streamer.pipeline.warmup"))


def _fail(command: str, message: object, code: int) -> int:
    if os.environ.get("STREAMER_DEBUG"):
        raise  # noqa: PLE0704 - called from an except block: the exception being handled
    print(f"streamer {command}: {message}", file=sys.stderr)
    return code


def _command_of(argv: list[str]) -> str:
    return next((a for a in argv if not a.startswith("-")), "")
