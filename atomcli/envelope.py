"""The envelope around a stage: read the input, check its columns, run, name the file in errors, write.

Stages never see paths (`run(table, config, context)`); this is the one place that turns a
stage into a file-to-file step. `atom <stage>` (cli.py) and `atom run-all` call the same two
functions, so a table written by run-all is the table the single command writes.
"""

from __future__ import annotations

from atomcli.errors import InputError


def read_input(path: str, stage: str, columns=None):
    """The input table, with the columns `stage` needs (InputError names the file)."""
    from atomcli import schema, tableio
    table = tableio.read_table(path)
    schema.require(table, stage, display(path), columns)
    return table


def display(path: str) -> str:
    return "<stdin>" if path == "-" else str(path)


def located(e: InputError, path: str) -> InputError:
    """A stage's error about a row or column names the input file."""
    if e.row is None and e.column is None:
        return e  # about a flag or a model, not about the table
    return e.located(file=display(path))


def input_columns(mod, config):
    """A stage whose needs depend on its flags (aggregate-reward --process none) says which columns."""
    fn = getattr(mod, "input_columns", None)  # stage modules, not plugins: an optional hook
    return fn(config) if fn is not None else None


def run_stage(stage: str, mod, config, table, context, source: str):
    try:
        return mod.run(table, config, context)
    except InputError as e:
        raise located(e, source) from None


def table_to_table(stage: str, mod, config, inp: str, out: str, context, fmt: str | None = None) -> None:
    """read -> require -> run -> write (atomically, with provenance) for a table stage."""
    from atomcli import safety, tableio
    safety.check_output(out, inputs=[inp])  # before any work: never over the input, never a folder
    table = read_input(inp, stage, input_columns(mod, config))
    result = run_stage(stage, mod, config, table, context, inp)
    tableio.write_stage(result, str(out), stage, config, inherit=table, fmt=fmt)


def table_to_checkpoint(stage: str, mod, config, inp: str, out: str, context) -> None:
    """read -> require -> run -> save for a stage that trains (sft, grpo-step)."""
    from atomcli import checkpoint
    result = train_from_table(stage, mod, config, inp, out, context)
    checkpoint.save(result, str(out), stage=stage, config=config, context=context)


def train_from_table(stage: str, mod, config, inp: str, out: str, context):
    """read -> require -> run for a stage that trains; the checkpoint.TrainResult, not yet saved to `out`
    (run-all saves it, or keeps it in memory, atomcli.train.resident)."""
    from atomcli import safety
    # never a folder that is not a checkpoint, never over the data or the model it trains from
    safety.check_output(out, safety.CHECKPOINT,
                        inputs=[inp, getattr(config, "model", None), getattr(config, "ref", None)])
    table = read_input(inp, stage)
    return run_stage(stage, mod, config, table, context, inp)
