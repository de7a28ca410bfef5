"""The `patchgym` command line: one entry point, YAML configs (`-c FILE`) and `key=value` overrides."""

import json
import signal
import sys
import time
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text
from typer.core import TyperGroup

from patchgym.config import Config, load_config
from patchgym.errors import UserError
from patchgym.files import read_json_object, read_text

# markup=False: what patchgym prints quotes task.toml keys ([environment]) and test ids (t[a]), which must print
# as they are, not as style tags; colour goes through style=.
console = Console(markup=False)
err_console = Console(markup=False, stderr=True)


class UserErrorsExit2(TyperGroup):
    """The command group whose commands end on a UserError with its message in red and exit status 2."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except UserError as exc:
            console.print(str(exc), style="red", soft_wrap=True)
            raise typer.Exit(2) from None


app = typer.Typer(cls=UserErrorsExit2, no_args_is_help=True, add_completion=False,
                  help="Train and evaluate SWE agents with RL.")
image_app = typer.Typer(no_args_is_help=True, help="Build images (no registry needed), or pull a task set's.")
app.add_typer(image_app, name="image")
app.add_typer(image_app, name="images", hidden=True)  # `patchgym images pull` reads better; both names work

ConfigFiles = typer.Option([], "--config", "-c", help="YAML config file(s), merged in order")
Overrides = typer.Argument(None, help="overrides like sandbox.backend=local", show_default=False)


def _config(files: list[Path], overrides: list[str] | None) -> Config:
    return load_config(files, overrides or [])


def _given(options: dict[str, str | None]) -> list[str]:
    """`key=value` overrides for the options that were given, e.g. {"inference.model": model} for --model."""
    return [f"{key}={value}" for key, value in options.items() if value]


@app.callback()
def _main() -> None:
    # SIGTERM ends us like Ctrl-C does, so sandboxes are closed on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


@app.command()
def doctor(files: list[Path] = ConfigFiles, overrides: list[str] = Overrides,
           reap: bool = typer.Option(False, "--reap", help="remove sandboxes left by crashed runs"),
           as_json: bool = typer.Option(False, "--json", help="print the checks as JSON")) -> None:
    """Check this machine: engines, bubblewrap, overlayfs, cgroups, disk, base image, packages."""
    from patchgym.doctor import run_checks

    config = _config(files, overrides)
    if reap:
        from patchgym.sandbox.reaper import reap as reap_now

        removed = reap_now()
        console.print(f"reaped {removed.total} leftovers: {removed.names}")
    checks = run_checks(config)
    failed = [c for c in checks if c.required and not c.ok]
    if as_json:
        print(json.dumps([c.__dict__ for c in checks], indent=2))
    else:
        table = Table(title=f"patchgym doctor (sandbox.backend={config.sandbox.backend})")
        for column in ("check", "status", "found", "fix"):
            table.add_column(column)
        for c in checks:
            status = (Text("ok", style="green") if c.ok else Text("MISSING", style="red") if c.required
                      else Text("warn", style="yellow"))
            table.add_row(c.name, status, c.detail, "" if c.ok else c.fix)
        console.print(table)
    for c in checks:
        if not c.ok and not as_json:
            console.print(f"fix for {c.name}: {c.fix}", soft_wrap=True)
    if failed:
        console.print(f"{len(failed)} required check(s) failed: {', '.join(c.name for c in failed)}", style="red")
        raise typer.Exit(1)


@image_app.command("build")
def image_build(backend: str = typer.Option("all", help="docker, local or all"),
                files: list[Path] = ConfigFiles, overrides: list[str] = Overrides) -> None:
    """Build the base image (debootstrap rootfs, and its Docker image); reused until its recipe changes."""
    from patchgym.sandbox import images

    _config(files, overrides)
    recipe = images.base_recipe()
    start = time.perf_counter()
    if backend in ("local", "all"):
        console.print(f"rootfs layers: {':'.join(map(str, images.ensure_rootfs(recipe)))}")
    if backend in ("docker", "all"):
        console.print(f"docker image: {images.ensure_docker_image(recipe)}")
    console.print(f"base image {recipe.tag} ready in {time.perf_counter() - start:.1f} s")


@image_app.command("pull")
def images_pull(tasks: Path = typer.Option(..., help="tasks JSONL whose images to pull"),
                concurrency: int = typer.Option(4, min=1, help="pulls at once"),
                force: bool = typer.Option(False, "--force", help="pull even when the disk looks too small"),
                files: list[Path] = ConfigFiles, overrides: list[str] = Overrides) -> None:
    """Pull the distinct images of a task set into the Docker engine, after checking the disk they need; with
    sandbox.backend=local, also unpack them into the rootfs cache."""
    from patchgym.sandbox import prepull, registry
    from patchgym.sandbox.docker import docker_client
    from patchgym.sandbox.errors import SandboxError
    from patchgym.tasks import read_tasks

    config = _config(files, overrides).sandbox
    names = []
    for task in read_tasks(tasks):
        try:
            names += [registry.mirrored(task.image, config.image_mirror)] if task.image else []
        except SandboxError as exc:
            raise UserError(f"{tasks}: task {task.instance_id}: {exc}") from None
    wanted = sorted({n for n in names if not n.startswith(registry.LOCAL_NAMESPACE)})
    local = len(set(names)) - len(wanted)
    client = docker_client()
    disk = prepull.plan(wanted, config, client, concurrency=concurrency)
    console.print(disk.line() + (f"; {local} patchgym/ images are built, not pulled (`patchgym tasks build`)"
                                 if local else ""), soft_wrap=True)
    for image, why in disk.unknown.items():
        console.print(f"size unknown: {image}: {why}", style="yellow", soft_wrap=True)
    prepull.refuse_if_short(disk, force)
    results = prepull.pull_all(disk, config, client, concurrency=concurrency)
    if config.backend == "local":  # its sandboxes start from rootfs layers: unpack them now, not at the first start
        from patchgym.sandbox.local import resolve_rootfs

        for r in (r for r in results if r.status != "failed"):
            start = time.monotonic()
            try:
                resolve_rootfs(r.image, config)
            except SandboxError as exc:
                r.status, r.reason, r.detail = "failed", "unpack", str(exc)
            r.seconds += time.monotonic() - start
    table = Table(title=f"{len(results)} images of {tasks}")
    for column in ("image", "status", "seconds"):
        table.add_column(column, no_wrap=True)
    table.add_column("detail")
    for r in results:
        status = f"{r.status}: {r.reason}" if r.reason else r.status
        table.add_row(r.image, status, f"{r.seconds:.1f}" if r.seconds else "", r.detail)
    console.print(table)
    counts = {s: sum(r.status == s for r in results) for s in ("pulled", "present", "failed")}
    console.print(", ".join(f"{n} {s}" for s, n in counts.items()))
    if counts["failed"]:
        raise typer.Exit(1)


@app.command()
def smoke(backend: list[str] = typer.Option([], "--backend", "-b", help="backend(s) to try (default: the config's)"),
          files: list[Path] = ConfigFiles, overrides: list[str] = Overrides) -> None:
    """Start a sandbox per backend, fix a tiny bug in it, and time each step."""
    from patchgym.sandbox.smoke import smoke as run_smoke

    config = _config(files, overrides)
    table = Table(title="sandbox smoke")
    for column in ("backend", "start ms", "exec ms (median)", "diff ms", "close ms", "tests"):
        table.add_column(column)
    for name in backend or [config.sandbox.backend]:
        t = run_smoke(config.sandbox.model_copy(update={"backend": name}))
        table.add_row(name, f"{t.start_ms:.0f}", f"{t.exec_ms:.2f}", f"{t.diff_ms:.0f}", f"{t.close_ms:.0f}",
                      t.tests)
    console.print(table)


tasks_app = typer.Typer(no_args_is_help=True, help="Import, list and build tasks.")
app.add_typer(tasks_app, name="tasks")


@tasks_app.command("import")
def tasks_import(source: str = typer.Argument(..., help="FILE.jsonl, FILE.parquet or hf:NAME[:split]; with --format "
                                                        "harbor, a task folder or a folder of them"),
                 fmt: str = typer.Option(..., "--format", "-f", help="swebench (v5 rows), swebench-classic "
                                         "(SWE-bench/Lite/Verified before v5), swegym, r2egym, smith, rebench or "
                                         "harbor (task folders)"),
                 out: Path = typer.Option(..., "--out", "-o", help="tasks JSONL to write"),
                 exclude_repos_of: Path | None = typer.Option(None, help="drop tasks whose repo is in this task file"),
                 offline: bool = typer.Option(False, "--offline", help="build Harbor folders' environments without a "
                                              "network (a step that downloads fails, naming the task and the step)"),
                 files: list[Path] = ConfigFiles, overrides: list[str] = Overrides) -> None:
    """Convert a public dataset, or Harbor task folders, into patchgym tasks; bad rows or folders are listed (with
    the file, row or folder and the key), good ones kept. Harbor folders' environments are built here, with the
    network docker gives a build (none with --offline)."""
    from patchgym.tasks import write_tasks
    from patchgym.tasks.decontaminate import exclude_repos
    from patchgym.tasks.loaders import import_tasks

    if fmt == "harbor":
        from patchgym.tasks import read_tasks
        from patchgym.tasks.harbor.importer import import_harbor

        result = import_harbor(source, _config(files, overrides).sandbox, offline=offline)
        if exclude_repos_of:
            result.tasks, result.dropped = exclude_repos(result.tasks, read_tasks(exclude_repos_of))
    else:
        result = import_tasks(fmt, source, exclude_repos_of=str(exclude_repos_of) if exclude_repos_of else None)
    for line in result.warnings:
        console.print(line, style="dim", soft_wrap=True)
    for line in result.errors:
        console.print(line, style="yellow", soft_wrap=True)
    if result.errors and not result.tasks:
        raise UserError(f"{source}: no row is a valid {fmt} task (the problems are listed above)")
    write_tasks(result.tasks, out)
    console.print(f"{len(result.tasks)} tasks -> {out}; {len(result.errors)} bad rows; "
                  f"{len(result.dropped)} dropped (repo in the evaluation set)")
    if not result.tasks:
        raise typer.Exit(1)


@tasks_app.command("export")
def tasks_export(tasks: Path = typer.Argument(..., help="tasks JSONL"),
                 fmt: str = typer.Option("harbor", "--format", "-f", help="harbor (task folders)"),
                 out: Path = typer.Option(..., "--out", "-o", help="folder to write one task folder per task into"),
                 files: list[Path] = ConfigFiles, overrides: list[str] = Overrides) -> None:
    """Write tasks as Harbor task folders (task.toml, instruction.md, environment/, tests/test.sh writing the reward,
    solution/solve.sh) that Harbor's own tooling runs; `tasks import --format harbor` reads them back."""
    from patchgym.tasks import read_tasks
    from patchgym.tasks.harbor.export import export_harbor

    if fmt != "harbor":
        raise UserError(f"unknown export format {fmt!r}: choose harbor")
    config = _config(files, overrides)
    written = export_harbor(read_tasks(tasks), out, config.sandbox, verifier_timeout_s=config.rollout.grade_timeout_s,
                            agent_timeout_s=config.agent.max_seconds)
    console.print(f"{len(written)} task folders -> {out}")


@tasks_app.command("list")
def tasks_list(path: Path, files: list[Path] = ConfigFiles, overrides: list[str] = Overrides) -> None:
    """A table of tasks: id, repo, #F2P, #P2P, and whether the image is built for the configured backend."""
    from patchgym.sandbox import images
    from patchgym.tasks import read_tasks
    from patchgym.tasks.loaders import task_rows

    config = _config(files, overrides)
    tasks = read_tasks(path)
    table = Table(title=f"{len(tasks)} tasks in {path}")
    for column in ("id", "repo", "F2P", "P2P", f"image built ({config.sandbox.backend})"):
        table.add_column(column)
    for row in task_rows(tasks, lambda tag: images.image_built(tag, config.sandbox.backend)):
        table.add_row(*map(str, row))
    console.print(table)


@tasks_app.command("validate")
def tasks_validate(tasks: Path = typer.Option(..., help="tasks JSONL"),
                   out: Path = typer.Option(..., "--out", "-o", help="folder for tasks.jsonl (the valid rows), "
                                                                     "broken.md and checks.jsonl; rerun to resume"),
                   runs: int = typer.Option(2, min=1, help="gradings of each patch (two catch flaky tests)"),
                   timeout: float = typer.Option(600.0, help="test run time limit in seconds"),
                   workers: int = typer.Option(1, min=1, help="rows checked at once, each in its own sandboxes"),
                   files: list[Path] = ConfigFiles, overrides: list[str] = Overrides) -> None:
    """In each row's own image: the gold patch must resolve, the empty patch must not, the same way every run."""
    from patchgym.eval.validate import broken_table, validate
    from patchgym.tasks import read_tasks

    config = _config(files, overrides)
    checks = validate(read_tasks(tasks), out, config.sandbox, runs=runs, timeout=timeout, workers=workers)
    console.print(broken_table(checks))
    console.print(f"{sum(c.valid for c in checks)} valid tasks -> {out / 'tasks.jsonl'}; broken rows: "
                  f"{out / 'broken.md'}")
    if not any(c.valid for c in checks):
        raise typer.Exit(1)


def _find_task(tasks_path: Path, instance: str):
    from patchgym.tasks import read_tasks

    tasks = {t.instance_id: t for t in read_tasks(tasks_path)}
    if instance not in tasks:
        raise UserError(f"no task {instance!r} in {tasks_path} ({len(tasks)} tasks)")
    return tasks[instance]


def _read_patch(patch: Path) -> str:
    """The patch file's text, or stdin's for '-'; a UserError when it is missing or not text."""
    if str(patch) != "-":
        return read_text(patch, "patch file")
    try:
        return sys.stdin.buffer.read().decode()
    except UnicodeDecodeError as exc:
        raise UserError(f"the patch on stdin is not UTF-8 text (byte {exc.start}): is it a binary file?") from None


@app.command()
def grade(tasks: Path = typer.Option(..., help="tasks JSONL"), instance: str = typer.Option(..., help="instance_id"),
          patch: Path = typer.Option(..., help="the patch to grade (unified diff; '-' for stdin)"),
          timeout: float = typer.Option(300.0, help="test run time limit in seconds (eval: 1800)"),
          as_json: bool = typer.Option(False, "--json", help="print the grade as one JSON object"),
          files: list[Path] = ConfigFiles, overrides: list[str] = Overrides) -> None:
    """Grade a patch in a fresh sandbox: resolved iff every FAIL_TO_PASS and PASS_TO_PASS test passes."""
    from patchgym.env.grading.grader import grade_patch

    config = _config(files, overrides)
    task = _find_task(tasks, instance)
    result = grade_patch(task, _read_patch(patch), config.sandbox, timeout=timeout)
    if as_json:
        keys = ("instance_id", "resolved", "tests", "f2p", "p2p", "error", "error_detail", "exit_code", "duration")
        print(json.dumps(result.model_dump(include=set(keys))))
    else:
        verdict = (Text("RESOLVED", style="green") if result.resolved
                   else Text.assemble(("not resolved", "red"), f" ({result.error or 'tests fail'})"))
        console.print(Text.assemble(f"{task.instance_id}: ", verdict, f" in {result.duration:.1f} s"), soft_wrap=True)
        for name, status in {**result.f2p, **result.p2p}.items():
            console.print(f"  {status:8} {name}", soft_wrap=True)
        if result.error_detail:
            console.print(result.error_detail, soft_wrap=True)
    if result.error == "infra":
        raise typer.Exit(3)


@app.command("eval")
def eval_(tasks: Path = typer.Option(..., help="tasks JSONL"),
          model: str | None = typer.Option(None, help="smollm2 (offline default), tiny, a model dir or hub id "
                                                      "(sets inference.model)"),
          engine: str | None = typer.Option(None, help="auto, hf, openai or vllm (sets inference.engine)"),
          policy: str | None = typer.Option(None, help="instead of a model: oracle (applies the gold fix) or null"),
          runs: int = typer.Option(1, min=1, help="attempts per task: Pass@1 is their mean, Pass@k for k <= runs"),
          out: Path | None = typer.Option(None, help="run directory; rerunning with it resumes "
                                                     "(default: RUN_DIR/eval-<model>-<time>)"),
          limit: int | None = typer.Option(None, help="only the first N tasks"),
          as_json: bool = typer.Option(False, "--json", help="end with one JSON line: the summary"),
          files: list[Path] = ConfigFiles, overrides: list[str] = Overrides) -> None:
    """Run the agent on every task `runs` times, grade each final patch, write summary.json and preds.jsonl.

    Eval's own defaults (agent.max_steps=100) are in patchgym/eval/defaults.yaml; -c files and overrides win over them.
    """
    from patchgym.eval.build import load_eval_config, run_eval
    from patchgym.eval.run import summary_table

    config = load_eval_config(files, [*_given({"inference.model": model, "inference.engine": engine}),
                                      *(overrides or [])])
    run = run_eval(config, tasks, script=policy, runs=runs, out=out, limit=limit, progress=not as_json)
    for warning in run.warnings:
        (err_console if as_json else console).print(warning, style="yellow", soft_wrap=True)
    if as_json:
        print(json.dumps(run.summary))
    else:
        console.print(summary_table(run.summary, title=f"eval {run.summary['model']} -> {run.run_dir}"))


@app.command("check-tokens")
def check_tokens(run: Path = typer.Argument(..., help="a run directory (or a trajectories .jsonl/.json file)"),
                 model: str | None = typer.Option(None, help="tokenizer to check against (default: the run's model)"),
                 as_json: bool = typer.Option(False, "--json", help="print the result as one JSON object")) -> None:
    """Check every trajectory's tokens: segments equal the chat template's rendering, samples decode to the text.

    Exit 0 only when both hold for every trajectory; non-canonical samples are counted as information.
    """
    from patchgym.agent.check_tokens import check_run, run_model_spec
    from patchgym.inference.models import load_tokenizer

    spec = model or run_model_spec(run if run.is_dir() else run.parent)
    if not spec:
        raise UserError(f"{run} has no run.json naming its model; pass --model")
    result = check_run(run, load_tokenizer(spec))
    summary = result.summary()
    if as_json:
        print(json.dumps(summary))
    else:
        for check in result.trajectories:
            for error in check.errors[:5]:
                console.print(f"{check.trajectory_id}: {error}", style="red", soft_wrap=True)
        console.print(f"{summary['trajectories']} trajectories, {summary['failed']} failed; "
                      f"{summary['sampled_segments']} sampled segments, {summary['non_canonical_segments']} "
                      "non-canonical (a re-tokenising pipeline would train on other tokens there)")
    if not result.ok:
        raise typer.Exit(1)


ChatTemplateOption = typer.Option(None, "--chat-template", help="a chat template file or a shipped name (qwen3, "
                                                               "qwen3-thinking-2507, qwen2.5-instruct); default: "
                                                               "the model's own")
ChatTemplateKwargsOption = typer.Option("{}", "--chat-template-kwargs",
                                        help='JSON object of template variables, e.g. \'{"enable_thinking": false}\'')


def _template_kwargs(text: str) -> dict:
    try:
        kwargs = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"--chat-template-kwargs is not JSON: {exc}") from None
    if not isinstance(kwargs, dict):
        raise UserError(f"--chat-template-kwargs must be a JSON object, got {text!r}")
    return kwargs


def configure_tokenizer_of(engine, chat_template: str | None, kwargs: dict):
    """`engine`, its tokenizer given the template and kwargs (patchgym.inference.chat_template)."""
    from patchgym.inference.chat_template import configure_tokenizer

    configure_tokenizer(engine.tokenizer, chat_template, kwargs)
    return engine


@app.command("check-template")
def check_template(model: str = typer.Option(..., help='"smollm2", "tiny-qwen3", "tiny-qwen2.5", a model directory '
                                                       'or a hub id'),
                   chat_template: str | None = ChatTemplateOption,
                   chat_template_kwargs: str = ChatTemplateKwargsOption,
                   as_json: bool = typer.Option(False, "--json", help="print the result as JSON")) -> None:
    """Render a probe conversation (system, user, assistant turns with thinking and tool calls, observations) and say,
    for each history mode (keep: append-only; template: step-wise samples), tool format and observation role,
    whether the template trains exactly, what the step-wise mode re-feeds, and which mode to use; exit 1 when no
    mode fits the default agent (text tool calls, user observations)."""
    from patchgym.agent.template_check import recommend, template_report
    from patchgym.inference.chat_template import configure_tokenizer
    from patchgym.inference.models import load_tokenizer

    tokenizer = configure_tokenizer(load_tokenizer(model), chat_template, _template_kwargs(chat_template_kwargs))
    fits = template_report(tokenizer)
    verdict = recommend(fits)
    if as_json:
        print(json.dumps({"fits": [{"history": f.history, "tool_format": f.tool_format,
                                    "observation_role": f.observation_role, "fits": f.fits, "problem": f.problem,
                                    **({"fed_tokens": f.fed_tokens, "whole_tokens": f.whole_tokens}
                                       if f.history == "template" else {})} for f in fits],
                          "recommendation": verdict}))
    else:
        for fit in fits:
            text = "fits exactly" if fit.fits else f"does not fit: {fit.problem}"
            if fit.fits and fit.history == "template":
                text += f" (re-feeds {fit.fed_tokens} prompt tokens over the probe's turns; the conversation is " \
                        f"{fit.whole_tokens})"
            console.print(f"history={fit.history} tool_format={fit.tool_format} observations={fit.observation_role}: "
                          f"{text}", style="green" if fit.fits else "red", markup=False, soft_wrap=True)
        console.print(verdict, markup=False, soft_wrap=True)
    if verdict.startswith("no history mode fits"):
        raise typer.Exit(1)


@app.command()
def serve(model: str = typer.Option(..., help='"smollm2", "tiny", a model directory or a hub id'),
          port: int = typer.Option(..., help="port to listen on (0 = any free port)"),
          host: str = typer.Option("127.0.0.1", help="address to listen on"),
          max_batch: int = typer.Option(8, help="requests decoded together"),
          device: str = typer.Option("cpu", help="torch device"),
          threads: int = typer.Option(1, help="torch CPU threads"),
          chat_template: str | None = ChatTemplateOption,
          chat_template_kwargs: str = ChatTemplateKwargsOption) -> None:
    """Serve a model over an OpenAI-compatible API (exact token ids and logprobs) until Ctrl-C or SIGTERM."""
    import torch

    from patchgym.inference.hf import HFEngine
    from patchgym.inference.server import serve as start_server

    torch.set_num_threads(threads)
    kwargs = _template_kwargs(chat_template_kwargs)
    with HFEngine.from_spec(model, device=device, max_batch=max_batch) as engine, \
            start_server(configure_tokenizer_of(engine, chat_template, kwargs), host, port, model_name=model) as server:
        print(f"serving {model} at {server.base_url} (Ctrl-C to stop)", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass


@app.command()
def train(files: list[Path] = ConfigFiles,
          resume: bool = typer.Option(False, "--resume", help="continue the run in --out from its latest checkpoint "
                                                              "(its config.yaml unless -c is given)"),
          out: Path | None = typer.Option(None, help="run directory (default: RUN_DIR/train-<time>)"),
          overrides: list[str] = Overrides) -> None:
    """RL-train the policy: rollouts, grades, filters, advantages, policy updates, weight sync, checkpoints."""
    from patchgym.train.loop import Trainer

    if resume and out is None:
        raise UserError("--resume needs --out RUN: the run directory to continue")
    if resume and not files and (out / "config.yaml").is_file():
        files = [out / "config.yaml"]
    config = _config(files, overrides)
    run = Trainer(config, out).run(resume=resume)
    _print_run(run, "train")


@app.command()
def plan(files: list[Path] = ConfigFiles,
         gpus: int = typer.Option(1, "--gpus", help="devices the run is sharded over"),
         gpu_gb: float = typer.Option(80.0, "--gpu-gb", help="memory of each device, GB"),
         model_config: Path | None = typer.Option(None, "--model-config", help="the model's config.json (default: "
                                                                                 "inference.model's)"),
         as_json: bool = typer.Option(False, "--json", help="print the plan as one JSON object"),
         overrides: list[str] = Overrides) -> None:
    """Memory per device to train (and serve) the configured model, from its config.json alone; does it fit?"""
    from patchgym.train.plan import GB, read_shape
    from patchgym.train.plan import model_config as read_model_config
    from patchgym.train.plan import plan as make_plan

    config = _config(files, overrides)
    raw, source = read_model_config(config, model_config)
    result = make_plan(config, read_shape(raw, source, config.train.lora), gpus, gpu_gb, model=source)
    if as_json:
        print(result.as_json())
        return
    table = Table(title=f"{source}: {gpus} x {gpu_gb:g} GB, {result.tokens_per_micro_batch} tokens per micro-batch, "
                        f"sequence parallel {result.sequence_parallel}")
    table.add_column("per device")
    table.add_column("GB", justify="right")
    for name, value in result.rows():
        table.add_row(name, f"{value / GB:.2f}")
    console.print(table)
    verdict = lambda ok: Text("fits", style="green") if ok else Text("does not fit", style="red")  # noqa: E731
    console.print(Text.assemble("training ", verdict(result.fits_training), f" in {gpu_gb:g} GB; engine ",
                                verdict(result.fits_engine), f" in {result.engine_budget / GB:.1f} GB (vLLM's share); "
                                "both at once: ", verdict(result.colocated)))


@app.command()
def rft(tasks: Path = typer.Option(..., help="tasks JSONL"),
        model: str | None = typer.Option(None, help="the policy (sets inference.model)"),
        runs: int = typer.Option(10, min=1, help="rollouts per task (Nebius: 10)"),
        out: Path = typer.Option(..., help="run directory; rerunning with it resumes the rollouts"),
        limit: int | None = typer.Option(None, help="only the first N tasks"),
        files: list[Path] = ConfigFiles, overrides: list[str] = Overrides) -> None:
    """Rejection fine-tuning: N rollouts per task, keep the resolved ones, SFT one epoch, save a checkpoint."""
    from patchgym.tasks import read_tasks
    from patchgym.train.rft import rft as run_rft

    config = _config(files, [*_given({"inference.model": model}), *(overrides or [])])
    checkpoint = run_rft(config, read_tasks(tasks)[:limit], runs, out)
    _print_run(out, "rft", checkpoint)


@app.command()
def sft(trajectories: list[Path] = typer.Option(..., "--trajectories", help="trajectory .jsonl/.json file(s) or "
                                                                             "run directories (repeatable)"),
        model: str | None = typer.Option(None, help="the model to fine-tune (sets inference.model)"),
        out: Path = typer.Option(..., help="run directory"),
        resolved_only: bool = typer.Option(False, "--resolved-only", help="keep only trajectories that resolved"),
        files: list[Path] = ConfigFiles, overrides: list[str] = Overrides) -> None:
    """SFT one epoch on trajectories: loss on sampled tokens only, format-error turns masked; save a checkpoint."""
    from patchgym.agent.trajectory_files import read_trajectories
    from patchgym.train.rft import sft as run_sft

    config = _config(files, [*_given({"inference.model": model}), *(overrides or [])])
    records = read_trajectories(trajectories)
    checkpoint = run_sft(config, [t for t in records if t.resolved or not resolved_only], out)
    _print_run(out, "sft", checkpoint)


@app.command()
def demos(tasks: Path = typer.Option(..., help="tasks JSONL (each with its gold patch)"),
          out: Path = typer.Option(..., help="output directory; rerunning with it resumes"),
          per_task: int = typer.Option(2, min=1, help="demos per task (they differ in order, search and wording)"),
          limit: int | None = typer.Option(None, help="only the first N tasks"),
          files: list[Path] = ConfigFiles, overrides: list[str] = Overrides) -> None:
    """Expert demonstrations: play each task's gold patch through the agent's tools in a sandbox, in the configured
    model's template and tool format, grade them, keep the resolving ones (OUT/trajectories.jsonl, for sft)."""
    from patchgym.inference.chat_template import configure_tokenizer
    from patchgym.inference.models import load_tokenizer
    from patchgym.rollout.demos import build_demos
    from patchgym.tasks import read_tasks

    config = _config(files, overrides)
    inference = config.inference
    tokenizer = configure_tokenizer(load_tokenizer(inference.model), inference.chat_template,
                                    inference.chat_template_kwargs)
    summary = build_demos(read_tasks(tasks)[:limit], tokenizer, config.agent, config.sandbox, out,
                          per_task=per_task, rollout=config.rollout, model=inference.model)
    table = Table(title=f"demos -> {out / 'trajectories.jsonl'}")
    for column in ("task", "kept", "played", "seconds", "why not kept"):
        table.add_column(column)
    for row in summary.by_task:
        table.add_row(row.task_id, str(row.kept), str(row.played), f"{row.seconds:.1f}",
                      "; ".join(row.reasons + row.notes)[:300])
    console.print(table)
    console.print(f"{summary.kept} of {summary.played} demos kept, {summary.tasks_with_a_demo} of {summary.tasks} "
                  f"tasks have one (summary: {out / 'summary.json'})", soft_wrap=True)
    if not summary.kept:
        raise typer.Exit(1)


def _print_run(run: Path, kind: str, checkpoint: Path | None = None) -> None:
    from patchgym.train.checkpoint import latest_checkpoint

    checkpoint = checkpoint or latest_checkpoint(run)
    console.print(f"{kind} run: {run}\nmetrics: {run / 'metrics.jsonl'}  (TensorBoard: tensorboard --logdir "
                  f"{run / 'tensorboard'})", soft_wrap=True)
    if checkpoint is not None:
        console.print(f"checkpoint: {checkpoint} (model: {checkpoint / 'model'})", soft_wrap=True)
    console.print(f"report: patchgym report {run} -> {run / 'report.html'}", soft_wrap=True)


@app.command()
def report(run: Path = typer.Argument(..., help="a train, eval or select run directory")) -> None:
    """Write RUN/report.html: the summary table and PNG plots (reward, pass@k, steps, tokens, terminations, time)."""
    from patchgym.report import write_report

    out = write_report(run)
    console.print(f"report: {out} (plots in {out.parent / 'report'})", soft_wrap=True)


@app.command()
def view(run: Path = typer.Argument(..., help="a train or eval run directory"),
         port: int = typer.Option(8765, help="port to listen on (0: any free port)"),
         host: str = typer.Option("127.0.0.1", help="address to bind (0.0.0.0 shows the run to the whole network)")
         ) -> None:
    """Serve a trajectory viewer for RUN: a filterable table; per trajectory its turns, patch and grade per test."""
    from patchgym.viewer import make_server

    server = make_server(run, host, port)
    bound_host, bound_port = server.server_address[:2]
    console.print(f"viewing {run} at http://{bound_host}:{bound_port}/ (Ctrl-C to stop)", soft_wrap=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


MoreAndOverrides = typer.Argument(None, show_default=False, help="more paths for the option before, and overrides "
                                                                 "like verifier.repro_tests=5")


def _verify_config(files: list[Path], args: list[str] | None) -> tuple[Config, list[Path]]:
    """(the config, the extra paths among `args`: those without '=')."""
    args = args or []
    return load_config(files, [a for a in args if "=" in a]), [Path(a) for a in args if "=" not in a]


def _positive_ints(text: str) -> list[int]:
    """--k's comma-separated values, refused unless each is a positive integer."""
    parts = [part.strip() for part in text.split(",") if part.strip()]
    if not parts or not all(part.isdecimal() and int(part) >= 1 for part in parts):
        raise UserError(f"--k: k must be positive integers, got {text!r}")
    return [int(part) for part in parts]


def _run_tasks_file(run: Path) -> Path:
    """The tasks file an eval run was made from, as its run.json records it."""
    meta = run / "run.json"
    recorded = read_json_object(meta, "run record").get("tasks_file") if meta.exists() else None
    if not recorded:
        raise UserError(f"{meta} does not name its tasks file; pass --tasks")
    return Path(recorded)


@app.command("select")
def select_(runs: list[Path] = typer.Option(..., "--runs", help="eval run directories: the candidates (more may "
                                                                "follow as plain arguments)"),
            tasks: Path | None = typer.Option(None, help="the tasks JSONL the runs were made from (default: the one "
                                                         "the first run's run.json names)"),
            verifier: str = typer.Option("hybrid", help="ef (P(YES)), eb (tests) or hybrid"),
            k: str = typer.Option("1,2,4,8,16", help="comma-separated k for Best@k and Pass@k"),
            out: Path = typer.Option(..., help="selection directory to write"),
            model: str | None = typer.Option(None, help="the verifier model (sets verifier.model)"),
            as_json: bool = typer.Option(False, "--json", help="end with one JSON line: the summary"),
            files: list[Path] = ConfigFiles, args: list[str] = MoreAndOverrides) -> None:
    """Pick one trajectory per task with a verifier; write Best@k vs Pass@k, scores, choices and preds to OUT."""
    from patchgym.inference.factory import make_engine
    from patchgym.tasks import read_tasks
    from patchgym.verify.run import select

    config, more = _verify_config(files, [*_given({"verifier.model": model}), *(args or [])])
    ks = _positive_ints(k)
    task_list = read_tasks(tasks or _run_tasks_file([*runs, *more][0]))
    spec = config.verifier.model or config.inference.model
    engine = make_engine(config.inference.model_copy(update={"model": spec}), next_token_logprobs=True)
    try:
        summary = select([*runs, *more], task_list, verifier, ks, out, engine, config.verifier, config.sandbox,
                         model_name=spec, seed=config.seed, progress=not as_json)
    finally:
        engine.close()
    if as_json:
        print(json.dumps(summary.to_dict()))
        return
    table = Table(title=f"select {verifier} ({spec}): {summary.tasks} tasks, {summary.candidates} candidates")
    for column in ("k", "best@k", "pass@k"):
        table.add_column(column, justify="right")
    for n in summary.k:
        best, oracle = summary.best_at[n], summary.pass_at[n]
        table.add_row(str(n), "n/a" if best is None else f"{best:.1%}", "n/a" if oracle is None else f"{oracle:.1%}")
    console.print(table)
    for n, reason in summary.null_k.items():
        console.print(f"k={n}: n/a, {reason}", soft_wrap=True)
    console.print(f"wrote {out}/summary.json, scores.jsonl, choices.jsonl, preds.jsonl", soft_wrap=True)


@app.command("train-verifier")
def train_verifier_(trajectories: list[Path] = typer.Option(..., "--trajectories", help="graded trajectory .jsonl "
                                                            "files or eval run directories (more may follow)"),
                    model: str = typer.Option(..., help="the model to fine-tune: smollm2, tiny, a directory, a hub id"),
                    out: Path = typer.Option(..., help="directory for the fine-tuned verifier (load_model(DIR))"),
                    files: list[Path] = ConfigFiles, args: list[str] = MoreAndOverrides) -> None:
    """Fine-tune a YES/NO judge on graded trajectories (label = resolved), the loss on the verdict token only."""
    import torch

    from patchgym.agent.trajectory_files import read_trajectories
    from patchgym.verify.train import train_verifier

    config, more = _verify_config(files, args)
    torch.set_num_threads(config.inference.threads)
    summary = train_verifier(read_trajectories([*trajectories, *more]), model, out, config.verifier,
                             config.train, device=config.inference.device, seed=config.seed)
    console.print(f"verifier: {out} ({summary.examples} examples, {summary.resolved} resolved, {summary.steps} "
                  f"steps); verdict loss {summary.loss_before:.4f} -> {summary.loss_after:.4f}", soft_wrap=True)


@tasks_app.command("build")
def tasks_build(packages: str = typer.Option(..., help="comma-separated package names from the recipes, or all"),
                per_package: int = typer.Option(3, help="tasks wanted per package"),
                seed: int = typer.Option(0, help="mutation order seed (same seed, same tasks)"),
                out: Path = typer.Option(..., "--out", "-o", help="output directory (resumable)"),
                workers: int = typer.Option(2, help="validation runs at once"),
                ecosystem: str = typer.Option("pypi", help="pypi (Python sdists, pytest) or npm (JavaScript "
                                                           "tarballs, tape)"),
                files: list[Path] = ConfigFiles, overrides: list[str] = Overrides) -> None:
    """Make validated tasks offline from PyPI sdists (or npm tarballs) by mutation (SWE-smith style); resumes where
    it stopped."""
    from patchgym.tasks.factory import build_tasks, ecosystem_named

    config = _config(files, overrides)
    recipes = ecosystem_named(ecosystem).recipes()
    names = list(recipes) if packages == "all" else [p.strip() for p in packages.split(",") if p.strip()]
    result = build_tasks(names, per_package, seed, out, ecosystem=ecosystem, backend=config.sandbox.backend,
                         workers=workers)
    console.print(f"{result.tasks} tasks -> {result.tasks_file}")
    if not result.tasks:
        raise typer.Exit(1)
