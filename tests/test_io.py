"""gors.core.io on its own: the messages for unusable paths, atomic writes, folder publishing and jsonl repair."""

from __future__ import annotations

import json
import logging
import os
import time

import pytest
from PIL import Image

from gors.core import io
from gors.core.io import PathError, TornLineError


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def test_first_missing_is_the_outermost_folder_a_mkdir_would_create(tmp_path):
    assert io.first_missing(tmp_path / "a" / "b" / "c") == tmp_path / "a"
    (tmp_path / "a").mkdir()
    assert io.first_missing(tmp_path / "a" / "b" / "c") == tmp_path / "a" / "b"


def test_a_folder_holding_only_the_named_files_is_removed_with_the_parents_made_for_it(tmp_path):
    made = tmp_path / "made"
    folder = made / "run" / "inner"
    folder.mkdir(parents=True)
    (folder / ".lock").write_text("")
    io.remove_folder_holding_only(folder, {".lock", "other"}, made)  # a subset of the names: removed
    assert not made.exists() and tmp_path.is_dir()

    folder.mkdir(parents=True)
    (folder / ".lock").write_text("")
    (folder / "samples").mkdir()  # work: the folder is kept
    io.remove_folder_holding_only(folder, {".lock"}, made)
    assert (folder / ".lock").exists()


def _link_to_nowhere(tmp_path):
    link = tmp_path / "mnt"
    link.symlink_to(tmp_path / "not-mounted")
    return link


def test_unusable_paths_are_named_with_the_flag_and_the_fix(tmp_path):
    file = tmp_path / "file"
    file.write_text("")
    link = _link_to_nowhere(tmp_path)
    to_file = tmp_path / "to-file"
    to_file.symlink_to(file)
    fix = "; pass a folder path that you can write to"
    cases = [
        (file, f"--output_dir='{file}' is a file, not a folder{fix}"),
        (to_file, f"--output_dir='{to_file}' is a file, not a folder{fix}"),  # a link, but to a file that exists
        (file / "run", f"--output_dir='{file / 'run'}' lies under a file, not a folder{fix}"),
        (link, f"--output_dir='{link}' is a link to {tmp_path / 'not-mounted'}, which does not exist (not mounted?)"),
        (link / "run", f"--output_dir='{link / 'run'}' lies under {link}, which is a link to {tmp_path / 'not-mounted'}"),
    ]
    for path, message in cases:
        for check in (io.make_folder, io.check_folder_path):
            with pytest.raises(PathError) as error:
                check(path, "--output_dir")
            assert str(error.value).startswith(message), (check.__name__, str(error.value))
    directory = IsADirectoryError(21, "Is a directory", str(tmp_path))
    assert str(io.unusable_path(directory, tmp_path)) == f"{tmp_path} is a folder, not a file{fix}"
    denied = PermissionError(13, "Permission denied", "/srv/runs")
    assert str(io.unusable_path(denied, "/srv/runs/a", "--output_dir")) == \
        f"--output_dir='/srv/runs/a' cannot be written: permission denied on /srv/runs{fix}"


def test_check_folder_path_accepts_a_new_folder_under_an_existing_one_and_creates_nothing(tmp_path):
    io.check_folder_path(tmp_path / "a" / "b")
    io.check_folder_path(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_files_and_folders_get_the_usual_permissions(tmp_path):
    (tmp_path / "file").write_text("")
    (tmp_path / "folder").mkdir()
    for name in ("file", "folder"):
        os.chmod(tmp_path / name, 0o700)
        io.set_usual_permissions(tmp_path / name)
    assert (tmp_path / "file").stat().st_mode & 0o777 == 0o666 & ~_umask()
    assert (tmp_path / "folder").stat().st_mode & 0o777 == 0o777 & ~_umask()


def test_a_json_number_is_an_int_or_a_float_not_a_boolean():
    assert io.is_json_number(1) and io.is_json_number(0.5) and io.is_json_number(float("nan"))
    assert not io.is_json_number(True) and not io.is_json_number("1") and not io.is_json_number(None)


def test_read_json_names_the_file_and_what_it_should_hold(tmp_path):
    path = tmp_path / "settings.json"
    path.write_text("{")
    with pytest.raises(ValueError, match=rf"{path}: not valid JSON \(.*line 1\); expected the settings"):
        io.read_json(path, "the settings")
    path.write_bytes(b"\xff\xfe{}")
    with pytest.raises(ValueError, match=rf"{path}: not a UTF-8 text file; expected the settings"):
        io.read_json(path, "the settings")
    assert io.read_json_if_present(tmp_path / "absent.json", "the settings") is None


def test_an_atomic_write_replaces_whole_or_leaves_the_old_file_and_no_temporary_one(tmp_path, monkeypatch):
    path = tmp_path / "summary.json"
    io.atomic_write_json(path, {"b": 1, "a": 2})
    assert path.read_text() == '{\n  "a": 2,\n  "b": 1\n}\n'  # keys sorted: the same record, the same bytes

    def killed(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(io.os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        io.atomic_write_json(path, {"a": 3})
    monkeypatch.undo()
    assert json.loads(path.read_text()) == {"a": 2, "b": 1} and sorted(p.name for p in tmp_path.iterdir()) == [path.name]
    (tmp_path / "folder").mkdir()
    with pytest.raises(PathError, match=r"folder: is a folder, where a file is to be written"):
        io.atomic_write_bytes(tmp_path / "folder", b"x")


def test_filter_jsonl_drops_the_rejected_rows_and_counts_them(tmp_path):
    path = tmp_path / "rows.jsonl"
    io.atomic_write_jsonl(path, [{"n": n} for n in range(5)])
    assert io.filter_jsonl(path, lambda row: row["n"] % 2 == 0) == 2
    assert [row["n"] for row in io.read_jsonl(path)] == [0, 2, 4]
    assert io.filter_jsonl(path, lambda row: True) == 0


def test_an_image_saved_under_an_upper_case_suffix_takes_its_format(tmp_path):
    digest = io.atomic_save_image(Image.new("RGB", (4, 4), "red"), tmp_path / "a.PNG")
    assert Image.open(tmp_path / "a.PNG").format == "PNG" and digest == io.file_sha256(tmp_path / "a.PNG")


def _folder(path, text: str):
    path.mkdir(parents=True)
    (path / "file.txt").write_text(text)
    return path


def test_publishing_a_folder_replaces_the_old_one_and_leaves_no_copy_aside(tmp_path):
    final = _folder(tmp_path / "checkpoint-2", "old")
    _folder(tmp_path / ".checkpoint-2.old", "older")  # an earlier publish killed after its first rename
    io.publish_folder(_folder(tmp_path / "staging", "new"), final)
    assert (final / "file.txt").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-2"]


def test_a_folder_left_aside_is_found_and_put_back_only_where_it_is_missing(tmp_path):
    _folder(tmp_path / ".checkpoint-1.old", "aside")  # killed between the renames: no checkpoint-1
    _folder(tmp_path / ".checkpoint-2.old", "aside")  # killed before deleting the copy: checkpoint-2 is whole
    _folder(tmp_path / "checkpoint-2", "new")
    assert io.left_aside(tmp_path, "checkpoint-*") == [(tmp_path / "checkpoint-1", tmp_path / ".checkpoint-1.old")]
    for name in ("checkpoint-1", "checkpoint-2"):
        io.recover_folder(tmp_path / name)
    assert (tmp_path / "checkpoint-1" / "file.txt").read_text() == "aside"
    assert (tmp_path / "checkpoint-2" / "file.txt").read_text() == "new"


def test_discarding_a_folder_deletes_its_copy_aside_and_a_half_deleted_one(tmp_path):
    folder = _folder(tmp_path / "best", "x")
    _folder(tmp_path / ".best.old", "x")
    _folder(tmp_path / ".best.discarded", "x")  # a discard killed while deleting
    _folder(tmp_path / "other", "kept")
    io.discard_folder(folder)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other"]


def test_only_staging_folders_untouched_for_the_limit_are_removed(tmp_path):
    old = _folder(tmp_path / ".upload.1.tmp", "killed writer's")
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    _folder(tmp_path / ".upload.2.tmp", "a running writer's")
    io.remove_stale_staging(tmp_path, ".upload.*.tmp", older_than_s=3600)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".upload.2.tmp"]


def test_published_files_replace_their_namesakes_with_the_usual_permissions(tmp_path):
    staging, folder = tmp_path / "staging", _folder(tmp_path / "lora", "old")
    _folder(staging, "new")
    os.chmod(staging / "file.txt", 0o600)  # as tempfile creates them
    io.publish_files(staging, folder)
    assert (folder / "file.txt").read_text() == "new"
    assert (folder / "file.txt").stat().st_mode & 0o777 == 0o666 & ~_umask()


def test_an_append_first_cuts_a_torn_last_line(tmp_path):
    path = tmp_path / "metadata.jsonl"
    path.write_text('{"n": 0}\n{"n": 1}\n{"n": ')
    io.append_jsonl(path, [{"n": 2}])
    assert path.read_text() == '{"n": 0}\n{"n": 1}\n{"n": 2}\n'
    assert not io.repair_jsonl(path)
    path.write_text("")
    assert not io.repair_jsonl(path) and path.read_text() == ""


def test_a_torn_line_is_reported_once_per_file_state(tmp_path, caplog):
    path = tmp_path / "part.jsonl"
    path.write_text('{"n": 0}\n{"n"')
    with caplog.at_level(logging.WARNING, logger="gors.core.io"):
        for _ in range(2):
            assert list(io.read_jsonl(path)) == [{"n": 0}]
        assert caplog.text.count("is incomplete") == 1
        path.write_text('{"n": 0}\n{"n": 1}\n{"n"')  # the file changed: another torn line
        assert list(io.read_jsonl(path)) == [{"n": 0}, {"n": 1}]
    assert caplog.text.count("is incomplete") == 2


def test_reading_a_whole_file_takes_an_unterminated_object_and_refuses_anything_else(tmp_path):
    path = tmp_path / "selection.jsonl"
    path.write_text('{"n": 0}\n\n{"n": 1}')  # a blank line, and an edited last line without its line feed
    assert list(io.read_jsonl(path, whole=True)) == [{"n": 0}, {"n": 1}]
    for last in ('{"n": ', "[1, 2]"):
        path.write_text('{"n": 0}\n' + last)
        with pytest.raises(TornLineError, match=r"selection.jsonl:2 is cut short"):
            list(io.read_jsonl(path, whole=True))
    path.write_text('{"n": 0}\n[1, 2]\n')
    with pytest.raises(ValueError, match=r"selection.jsonl:2 is '\[1, 2\]', not a JSON object"):
        list(io.read_jsonl(path))
