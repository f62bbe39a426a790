"""`promote PIPELINE VARIANT`: the spec change that makes a variant the pipeline's model and
prompt, as a unified diff of its YAML file on stdout; `--write` applies it once the new file
validates. An eval never changes a pipeline by itself: this command is the one way a variant
becomes the baseline, and the old baseline stays as the variant `previous`
(evaluation/promote.py has the rules).
"""

import sys

import click

from llm_assets.cli.args import EXIT_ERROR, load_settings, pipeline_spec
from llm_assets.cli.console import note, print_error


@click.command()
@click.argument("pipeline")
@click.argument("variant")
@click.option("--write", is_flag=True, help="Write the change to the spec file (it validates).")
def promote(pipeline: str, variant: str, write: bool) -> None:
    """Print the spec change that makes VARIANT the pipeline's model and prompt (the old ones
    stay as the variant `previous`); --write applies it."""
    from llm_assets.evaluation.promote import PREVIOUS, ChangedSince, plan_promotion

    spec = pipeline_spec(load_settings(), pipeline)
    try:
        promotion = plan_promotion(spec, variant)
    except KeyError as exc:
        raise click.UsageError(str(exc.args[0])) from exc
    click.echo(promotion.diff(), nl=False)
    if promotion.replaced_previous:
        note(f"the variant {PREVIOUS!r} is replaced by the baseline before {variant}")
    for name in promotion.dropped:
        note(f"the variant {name!r} would equal the new baseline, so it is removed")
    if promotion.version_reminder:
        note(f"reminder: {promotion.version_reminder}")
    if not promotion.comments_kept:
        note(
            f"{promotion.path} is rewritten as a whole: its layout cannot be edited in place, "
            "so its comments are not kept"
        )
    problems = promotion.problems()
    for problem in problems:
        print_error(str(problem))
    if problems:
        note(f"{len(problems)} problem(s) in the promoted spec; nothing written")
        sys.exit(EXIT_ERROR)
    if not write:
        note("nothing written; run again with --write to apply the change")
        return
    try:
        promotion.write()
    except ChangedSince as exc:
        print_error(str(exc))
        sys.exit(EXIT_ERROR)
    note(
        f"wrote {promotion.path}: {variant} is the baseline of {spec.name}, the old one is "
        f"the variant {PREVIOUS!r}"
    )
