"""A failed build's message (fast tier; the build itself runs in tests/tasks/test_harbor.py): whole lines, the step
it failed at, and the line that says why even where the step printed much after it."""

from patchgym.tasks.harbor.build import BuildOutput


def test_a_failed_steps_output_is_whole_lines_with_the_cause_before_the_tail():
    output = BuildOutput()
    for piece in ("Step 1/2 : COPY . /app\n ---> 1f2e\nStep 2/2 : RUN python3 fetch", ".py\n Traceback (most rec",
                  "ent call last):\nurllib.error.URLError: <urlopen error [Errno -3] Temporary failure in name "
                  "resolution>\n", *(f"  frame {i}\n" for i in range(20)), "The command '/bin/sh -c python3 f"):
        output.feed(piece)
    assert output.step == "Step 2/2 : RUN python3 fetch.py"
    lines = output.summary().splitlines()
    assert lines[0] == "urllib.error.URLError: <urlopen error [Errno -3] Temporary failure in name resolution>"
    assert lines[1] == "..." and lines[-1] == "The command '/bin/sh -c python3 f" and len(lines) == 12
    assert all(line.startswith(("  frame", "The command", "urllib", "...")) for line in lines), lines
