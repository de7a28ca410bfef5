"""parse_patch: a unified diff read back as files and hunks, on diffs git itself wrote."""

from patchgym.tasks.diffs import parse_patch


def test_files_and_hunks_of_a_git_diff_with_a_new_a_deleted_and_a_changed_file(make_diff):
    before = {"a.py": "one\ntwo\nthree\nfour\nfive\nsix\nseven\neight\nnine\nten\n", "gone.py": "x = 1\n"}
    after = {"a.py": "one\nTWO\nthree\nfour\nfive\nsix\nseven\neight\nnine\nTEN", "new/b.py": "y = 2\n"}
    changed, gone, new = sorted(parse_patch(make_diff(before, after)), key=lambda f: f.path)

    assert (changed.old_path, changed.new_path) == ("a.py", "a.py")
    first, last = changed.hunks
    assert (first.old_start, first.old, first.new) == (1, ["one\n", "two\n", "three\n", "four\n", "five\n"],
                                                       ["one\n", "TWO\n", "three\n", "four\n", "five\n"])
    assert (first.before, first.after) == (1, 3)
    assert last.old[-1] == "ten\n" and last.new[-1] == "TEN"  # "\ No newline at end of file" drops the newline
    assert (last.before, last.after) == (3, 0)
    assert (gone.old_path, gone.new_path, gone.hunks[0].new) == ("gone.py", None, [])
    assert (new.old_path, new.path, new.hunks[0].old_start, new.hunks[0].new) == (None, "new/b.py", 0, ["y = 2\n"])
