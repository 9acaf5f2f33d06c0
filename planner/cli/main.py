"""Entry point: the ``planner`` command group.  Each command group lives in its own module;
the logic lives in ``planner.api``.  Errors become one message and an exit code, never a
traceback (DESIGN §8)."""

from __future__ import annotations

import importlib
import sys
import traceback

import click

from planner.errors import INTERRUPTED_EXIT, PlannerError, debug_enabled

# command name -> module under planner.cli holding a click command of the same name
COMMANDS = {
    "validate": "validate", "catalog": "catalog", "evaluate": "evaluate", "plan": "plan",
    "simulate": "simulate", "launch": "launch", "run": "run", "profile": "profile",
    "replan": "replan", "schedule": "schedule", "pareto": "pareto", "rebalance": "rebalance",
    "diff": "diff",
}


class LazyGroup(click.Group):
    """Imports a command's module only when it runs, so ``planner validate`` stays light."""

    def list_commands(self, ctx):
        return sorted(COMMANDS)

    def get_command(self, ctx, name):
        module_name = COMMANDS.get(name)
        if module_name is None:
            return None
        try:
            module = importlib.import_module(f"planner.cli.{module_name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"planner.cli.{module_name}":
                raise  # a missing dependency inside the command is a bug, not "no such command"
            return None
        return getattr(module, name.replace("-", "_"), None)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="planner")
def cli():
    """Heterogeneity-aware placement optimizer for distributed training."""


def main(argv: list[str] | None = None) -> int:
    # `--calibration` holds for one command without any state to restore here: the commands
    # pass it to planner.api, which prices with it for that call only.
    return _main(argv)


def _main(argv: list[str] | None) -> int:
    try:
        # Without standalone mode click returns ctx.exit()'s code instead of raising it.
        rc = cli.main(args=argv, prog_name="planner", standalone_mode=False)
    except PlannerError as exc:
        click.echo(f"error: {exc}", err=True)
        return exc.exit_code
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return INTERRUPTED_EXIT
    except click.ClickException as exc:
        exc.show()
        return 2
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        return INTERRUPTED_EXIT
    except Exception as exc:  # noqa: BLE001 - a bug: say so in one line; the traceback on request
        if debug_enabled():
            traceback.print_exc()
        click.echo(f"internal error (a bug in planner, please report it): {type(exc).__name__}: {exc}; "
                   "set PLANNER_DEBUG=1 for the traceback", err=True)
        return 3
    return rc if isinstance(rc, int) else 0


def run() -> None:  # pragma: no cover - console script shim
    sys.exit(main())
