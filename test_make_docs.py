"""Tests of make_docs.py and of the guide it renders: every committed page is what the templates and the
committed results render (a number edited by hand is caught, a changed result changes the page), every
flag a page documents is in its program's --help with the same default, every page is reachable from
README.txt and every link resolves, README.txt fits a terminal.

    python -m unittest -v test_make_docs

Rendering reads files only (no training): the whole file takes about a second after the imports.
"""

import contextlib
import json
import os
import re
import shutil
import tempfile
import unittest
from unittest import mock

import make_docs
from atlas import claims
from lab.testing import HERE, run_main, single_thread_module

setUpModule, tearDownModule = single_thread_module()  # the atoms' demo values run on one torch thread
README = os.path.join(HERE, "README.txt")
PAGES = {}  # the rendering of the committed templates and results, shared by the tests (filled once)


def rendered():
    if not PAGES:
        PAGES.update(make_docs.render_all(HERE))
    return PAGES


def read(path):
    with open(path, encoding="utf-8") as handle:
        return handle.read()


def rendered_for_an_unchanged_copy():
    """A patch of make_docs.render_all for main() over a copy_of_the_lab() without `replace` (its templates and
    results are the lab's, through links): its pages are rendered(), computed once per test process. A root
    whose templates or results are not the lab's is refused."""
    pages = rendered()  # now, before the patch: the lab's own rendering

    def render_all(root=HERE):
        for name in (make_docs.TEMPLATES, "results", make_docs.ATLAS):
            if os.path.realpath(os.path.join(root, name)) != os.path.realpath(os.path.join(HERE, name)):
                raise AssertionError(f"{root}: {name} is not the lab's, so its pages are not rendered()")
        return dict(pages)

    return mock.patch.object(make_docs, "render_all", render_all)


@contextlib.contextmanager
def copy_of_the_lab(replace=None):
    """A temporary root that holds the lab as it is (links to every file and folder) with the rendered
    pages copied, so that a test can edit a page or a result there; replace: {relative path: text} of
    files written instead of linked."""
    replace = replace or {}
    with tempfile.TemporaryDirectory() as root:
        for name in os.listdir(HERE):
            if name in ("docs", "README.txt", ".git") or any(path.split("/")[0] == name for path in replace):
                continue
            os.symlink(os.path.join(HERE, name), os.path.join(root, name))
        os.makedirs(os.path.join(root, "docs"))
        os.symlink(os.path.join(HERE, make_docs.TEMPLATES), os.path.join(root, make_docs.TEMPLATES))
        for path in make_docs.committed_pages(HERE):
            os.makedirs(os.path.dirname(os.path.join(root, path)) or root, exist_ok=True)
            shutil.copyfile(os.path.join(HERE, path), os.path.join(root, path))
        for path, text in replace.items():
            top = path.split("/")[0]
            if top != os.path.basename(path) and not os.path.exists(os.path.join(root, top)):
                shutil.copytree(os.path.join(HERE, top), os.path.join(root, top))  # a real copy to edit in
            with open(os.path.join(root, path), "w", encoding="utf-8") as handle:
                handle.write(text)
        yield root


class CommittedPages(unittest.TestCase):
    def test_every_committed_page_is_what_the_templates_and_results_render(self):
        problem = make_docs.first_difference(rendered(), HERE)
        self.assertIsNone(problem, f"{problem}\nrun python make_docs.py and commit the pages")
        self.assertGreaterEqual(len(rendered()), 20)
        self.assertEqual(sorted(rendered()), sorted(make_docs.committed_pages(HERE)))

    def test_a_number_edited_by_hand_in_a_page_is_caught(self):
        final = json.loads(read(os.path.join(HERE, "results", "ppo.json")))["final"]["expected_reward"]
        page = read(os.path.join(HERE, "docs", "bandit.md"))
        self.assertIn(repr(final), page)  # the page quotes the committed number in full
        line = page[:page.index(repr(final))].count("\n") + 1
        edited = page.replace(repr(final), repr(final)[:-1] + str((int(repr(final)[-1]) + 1) % 10))
        with copy_of_the_lab() as root:
            with open(os.path.join(root, "docs", "bandit.md"), "w", encoding="utf-8") as handle:
                handle.write(edited)
            problem = make_docs.first_difference(rendered(), root)
            self.assertIsNotNone(problem)
            self.assertTrue(problem.startswith(f"docs/bandit.md line {line} differs"), problem)
            with rendered_for_an_unchanged_copy():  # only a page was edited
                code, stdout, stderr = run_main(lambda argv: make_docs.main(argv, root=root), ["--check"])
            self.assertEqual((code, stdout), (1, ""))
            self.assertEqual(len(stderr.splitlines()), 1, stderr)
            self.assertIn(f"docs/bandit.md line {line}", stderr)
            self.assertEqual(read(os.path.join(root, "docs", "bandit.md")), edited)  # --check writes nothing

    def test_a_learners_files_of_exercises_change_no_page(self):
        import exercises

        cited = "arX" + "iv"  # split: this file's own text must cite nothing
        learner = exercises.stub_text("hard.py") + f"\n# see {cited} 2402.03300 and {cited} 9999.99999\n"
        self.assertTrue(learner.startswith(make_docs.LEARNER_FILE_START))
        with copy_of_the_lab({"my_atoms.py": exercises.stub_text(), "hard.py": learner,
                              "test_hard.py": learner}) as root:
            self.assertEqual(make_docs.lab_python_files(root), make_docs.lab_python_files(HERE))
            pages = make_docs.render_all(root)
        self.assertIsNone(make_docs.first_difference(pages, HERE))

    def test_a_difference_far_into_a_long_line_shows_in_the_message(self):
        old, new = "x" * 300 + "0.758" + "y" * 200, "x" * 300 + "0.762" + "y" * 200
        page, rendering = make_docs._around_difference(old, new)
        self.assertEqual((page[:3], page[-3:]), ("...", "..."))
        self.assertIn("0.758", page)
        self.assertIn("0.762", rendering)
        self.assertLessEqual(len(page), 126)
        self.assertEqual(make_docs._around_difference("short a", "short b"), ("short a", "short b"))

    def test_a_changed_result_changes_every_page_that_quotes_it(self):
        report = json.loads(read(os.path.join(HERE, "results", "ppo.json")))
        report["final"]["expected_reward"] = 0.91234567
        with copy_of_the_lab({"results/ppo.json": json.dumps(report)}) as root:
            pages = make_docs.render_all(root)
        self.assertIn("PPO 0.9123", pages["README.txt"])
        self.assertIn("0.91234567", pages["docs/bandit.md"])
        self.assertIn("0.9123", pages["docs/algorithms/ppo.md"])
        problem = make_docs.first_difference(pages, HERE)
        self.assertTrue(problem.startswith("README.txt line "), problem)  # README first: the render order

    def test_the_atlas_pages_follow_the_folders_whatever_they_hold(self):
        # a folder in a newer format (claims with verdicts, a summary.md with text before its tables)
        settings = {"experiment": "made-up", "summary": "a made-up experiment", "claim": "X beats Y",
                    "source": "nowhere (a made-up source)", "command": "python experiments.py made-up",
                    "seeds": [100, 101],
                    "claims": [claims.check_claim(claims.Claim("X beats Y in most seeds", lambda runs: True),
                                                  {100: {}, 101: {}})],
                    "configurations": [{"label": {"x": 1}, "runner": "run_x", "options": {"x": 1}}]}
        summary = "**made-up**: text\n\nX beats Y\n\n| verdict | seeds |\n|---|---|\n| holds | 2 of 2 |\n"
        gone = make_docs.experiment_folders(HERE)[0]
        with tempfile.TemporaryDirectory() as atlas:
            for name in make_docs.experiment_folders(HERE)[1:]:
                os.symlink(os.path.join(HERE, make_docs.ATLAS, name), os.path.join(atlas, name))
            os.makedirs(os.path.join(atlas, "made-up"))
            for name, text in (("settings.json", json.dumps(settings)), ("summary.md", summary)):
                with open(os.path.join(atlas, "made-up", name), "w", encoding="utf-8") as handle:
                    handle.write(text)
            with copy_of_the_lab() as root:
                os.remove(os.path.join(root, make_docs.ATLAS))
                os.symlink(atlas, os.path.join(root, make_docs.ATLAS))
                pages = make_docs.render_all(root)
                problem = make_docs.first_difference(pages, root)
                table_problem = make_docs.first_difference({"docs/atlas.md": pages["docs/atlas.md"]}, root)
        page = pages["docs/atlas/made-up.md"]
        self.assertIn("**holds**, 2 of 2 seeds: X beats Y in most seeds", page)
        self.assertIn("| holds | 2 of 2 |", page)
        self.assertNotIn("**made-up**: text", page)  # the claim is shown once, from settings.json
        self.assertIn("seeds 100-101", page)
        self.assertNotIn(f"docs/atlas/{gone}.md", pages)
        self.assertIn("made-up", pages["docs/atlas.md"])
        self.assertTrue(problem.startswith("README.txt line "), problem)  # the headline counts its claim
        self.assertIn("The atlas states", problem)
        self.assertTrue(table_problem.startswith("docs/atlas.md line "), table_problem)  # its table gained a row
        self.assertEqual(make_docs.first_difference({"docs/atlas/made-up.md": page}, HERE),
                         "docs/atlas/made-up.md is missing: run python make_docs.py")
        without = {path: text for path, text in rendered().items() if path != f"docs/atlas/{gone}.md"}
        self.assertTrue(make_docs.first_difference(without, HERE).startswith(f"docs/atlas/{gone}.md is not rendered"))

    def test_a_metric_note_follows_the_table_only_of_the_experiments_that_show_the_metric(self):
        note = make_docs.METRIC_NOTES["sampler_kl"]
        self.assertIn("k1", note)
        page = rendered()["docs/atlas/precision-mismatch.md"]
        # right under the table in which a sampler_kl mean is negative (the float16 row's, in the committed atlas)
        header = next(line for line in page.splitlines() if line.startswith("| configuration | seeds | sampler_"))
        column = header.split(" | ").index("sampler_kl")
        means = [line.split(" | ")[column].split(" +- ")[0] for line in page.splitlines()
                 if line.startswith("| sampler=float16") and " +- " in line]
        self.assertEqual(len(means), 1)
        self.assertLess(float(means[0]), 0.0)
        self.assertIn(" |\n\n" + note + "\n\n## Configurations", page)
        shown = [path for path, text in rendered().items() if note in text]
        self.assertEqual(shown, ["docs/atlas/precision-mismatch.md"])  # no other experiment logs sampler_kl

    def test_a_result_that_is_malformed_or_not_a_file_is_one_line_naming_it(self):
        cases = {"results/ppo.json": ("{", "results/ppo.json: not valid JSON"),
                 "results/grpo.csv": ("step,expected_reward\n", "results/grpo.csv: no data rows"),
                 "results-chain/ppo-chain.csv": ("\udcff", "results-chain/ppo-chain.csv: not a readable CSV")}
        for path, (text, expected) in cases.items():
            with self.subTest(path=path), copy_of_the_lab({path: ""}) as root:
                with open(os.path.join(root, path), "w", encoding="utf-8", errors="surrogateescape") as handle:
                    handle.write(text)  # "\udcff" writes the byte 0xff: not UTF-8
                code, stdout, stderr = run_main(lambda argv, root=root: make_docs.main(argv, root=root), ["--check"])
                self.assertEqual((code, stdout), (1, ""))
                self.assertEqual(stderr.strip(), f"make_docs.py: error: {expected}" + stderr.strip().split(expected)[1])
                self.assertEqual(len(stderr.splitlines()), 1)
        with copy_of_the_lab({"results/ppo.json": ""}) as root:  # a FIFO would block a reader forever
            os.remove(os.path.join(root, "results", "ppo.json"))
            os.mkfifo(os.path.join(root, "results", "ppo.json"))
            with self.assertRaisesRegex(make_docs.RenderError, r"^results/ppo\.json: not a regular file$"):
                make_docs.render_all(root)

    def test_a_page_that_is_a_link_or_a_folder_is_never_replaced_nor_removed(self):
        with copy_of_the_lab() as root:
            os.remove(os.path.join(root, "docs", "chain.md"))
            os.mkdir(os.path.join(root, "docs", "chain.md"))  # a rendered page's place taken by a folder
            os.symlink(os.devnull, os.path.join(root, "docs", "extra.md"))  # an unrendered page that is a link
            with rendered_for_an_unchanged_copy():  # only the pages' places were changed
                code, stdout, stderr = run_main(lambda argv: make_docs.main(argv, root=root), ["--check"])
                self.assertEqual((code, stdout), (1, ""))
                self.assertIn("docs/chain.md is not a regular file", stderr)
                code, stdout, stderr = run_main(lambda argv: make_docs.main(argv, root=root), [])
            self.assertEqual((code, stdout), (1, ""))
            self.assertIn("is not a regular file (a link, folder or device): it is never replaced nor removed", stderr)
            self.assertTrue(os.path.isdir(os.path.join(root, "docs", "chain.md")))
            self.assertTrue(os.path.islink(os.path.join(root, "docs", "extra.md")))

    def test_a_file_of_the_users_under_docs_is_kept_and_named(self):
        with copy_of_the_lab() as root:
            notes = os.path.join(root, "docs", "my-notes.md")
            with open(notes, "w", encoding="utf-8") as handle:
                handle.write("my notes\n")
            with rendered_for_an_unchanged_copy():
                code, stdout, stderr = run_main(lambda argv: make_docs.main(argv, root=root), [])
            self.assertEqual((code, stderr), (0, ""))
            self.assertIn("kept docs/my-notes.md: no template renders it", stdout)
            self.assertTrue(stdout.rstrip().endswith("0 rewritten, 1 kept unrendered"), stdout)
            with open(notes, encoding="utf-8") as handle:
                self.assertEqual(handle.read(), "my notes\n")

    def test_a_template_error_names_the_template_line_and_placeholder(self):
        with self.assertRaisesRegex(make_docs.RenderError, r"^t\.md line 2: \{\{nothing\.here:\.4f\}\}: NameError"):
            make_docs.render("fine\n{{nothing.here:.4f}}", {}, "t.md")
        self.assertEqual(make_docs.render("{{1/8:.3f}} and {{x.y}}", {"x": make_docs.Data(y=2)}, "t.md"),
                         "0.125 and 2")


# ---------------------------------------------------------------------------------------------
# The flags the guide documents, against each program's --help
# ---------------------------------------------------------------------------------------------


def documented_flags():
    """[(page, program, flag, default, description)] of every row of every flags table of the pages."""
    found = []
    for page, text in rendered().items():
        program = None
        for line in text.splitlines():
            marker = re.fullmatch(r"<!-- flags of (\S+) -->", line)
            if marker:
                program = marker.group(1)
            elif program and line.startswith("| `"):
                cells = re.split(r"(?<!\\) \| ", line.strip("| "))
                found.append((page, program, cells[0].strip("`"), make_docs.unescape(cells[2]),
                              make_docs.unescape(cells[3])))
            elif program and not line.startswith("|"):
                program = None
    return found


def help_of(program):
    import importlib

    module = importlib.import_module(make_docs.PROGRAMS[program])
    code, stdout, stderr = run_main(module.main, ["--help"])
    assert (code, stderr) == (0, ""), (program, code, stderr)
    return " ".join(stdout.split())


class Flags(unittest.TestCase):
    def test_every_flag_the_guide_documents_is_in_the_programs_help_with_the_same_default(self):
        helps = {}
        rows = documented_flags()
        tables = {program for text in rendered().values() for program in re.findall(r"<!-- flags of (\S+) -->", text)}
        self.assertEqual(tables, set(make_docs.PROGRAMS))  # every program has its table (library_map's is empty)
        for page, program, flag, default, description in rows:
            with self.subTest(page=page, program=program, flag=flag):
                if program not in helps:
                    helps[program] = help_of(program)
                shown = helps[program]
                for name in flag.split(", "):
                    self.assertIn(name, shown)
                if default:
                    self.assertIn(f"default: {' '.join(default.split())})", shown)
                self.assertIn(" ".join(description.split()), shown)

    def test_every_option_of_every_program_is_documented(self):
        documented = {(program, flag) for _, program, flag, *_ in documented_flags()}
        for program in make_docs.PROGRAMS:
            for row in make_docs.flag_rows(program):
                self.assertIn((program, row["flag"]), documented)

    def test_the_default_is_split_from_the_help_as_help_shows_it(self):
        self.assertEqual(make_docs.split_default("steps; integer in [1, 10] (default: 120)"),
                         ("120", "steps; integer in [1, 10]"))
        self.assertEqual(make_docs.split_default("write FILE (see x.py; default: off, train)"),
                         ("off, train", "write FILE (see x.py; default: off, train)"))
        self.assertEqual(make_docs.split_default("no default here"), ("", "no default here"))


# ---------------------------------------------------------------------------------------------
# Links, reachability and README.txt
# ---------------------------------------------------------------------------------------------

FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading):
    """GitHub's anchor of a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(text):
    return {slug(line.lstrip("#")) for line in FENCE.sub("", text).splitlines() if line.startswith("#")}


def links_of(path, text):
    """The local targets a page links to, as (repository path, anchor or None)."""
    if path.endswith(".txt"):
        targets = re.findall(r"(?<![\w/.])(docs/[\w/.-]+\.md)", text)
    else:
        targets = [target for target in LINK.findall(FENCE.sub("", text)) if "://" not in target]
    found = []
    for target in targets:
        where, _, anchor = target.partition("#")
        resolved = os.path.normpath(os.path.join(os.path.dirname(path), where)) if where else path
        found.append((resolved.replace(os.sep, "/"), anchor or None))
    return found


class Links(unittest.TestCase):
    def test_every_page_is_reachable_from_the_readme_and_every_link_resolves(self):
        pages = {path: read(os.path.join(HERE, path)) for path in make_docs.committed_pages(HERE)}
        reached, queue = {"README.txt"}, ["README.txt"]
        while queue:
            page = queue.pop()
            for target, anchor in links_of(page, pages[page]):
                with self.subTest(page=page, target=target, anchor=anchor):
                    self.assertTrue(os.path.exists(os.path.join(HERE, target)), f"{page} links to {target}")
                    if anchor is not None:
                        self.assertIn(anchor, anchors(pages[target]), f"{page} links to {target}#{anchor}")
                if target in pages and target not in reached:
                    reached.add(target)
                    queue.append(target)
        self.assertEqual(sorted(set(pages) - reached), [])

    def test_readme_fits_a_terminal_and_starts_with_the_quick_start(self):
        lines = read(README).splitlines()
        self.assertLessEqual(len(lines), 200)
        for number, line in enumerate(lines, start=1):
            self.assertLessEqual(len(line), 100, f"README.txt line {number}")
        first_screen = "\n".join(lines[:24])
        self.assertIn("python3 -m venv .venv && . .venv/bin/activate && pip install --retries 0 -r requirements.txt",
                      first_screen)
        self.assertIn("python rl_lab.py --algorithm all", first_screen)

    def test_the_readme_gives_the_test_command_ci_runs(self):
        ci = read(os.path.join(HERE, ".ci", "run")).splitlines()
        self.assertIn("python -m unittest", ci)
        self.assertRegex(read(README), r"\n    python -m unittest +#")


class Course(unittest.TestCase):
    """docs/learn/: ten chapters in course.py's order, each with what a chapter must hold."""

    def test_each_chapter_has_a_computed_figure_pseudocode_a_rendered_number_and_its_exercises(self):
        import course
        import exercise_cases

        by_chapter = {}
        for exercise in exercise_cases.EXERCISES:
            by_chapter.setdefault(exercise.chapter, []).append(exercise.name)
        self.assertEqual(sorted(by_chapter), sorted(course.CHAPTERS))
        for chapter in course.CHAPTERS:
            with self.subTest(chapter=chapter):
                template = read(os.path.join(HERE, "docs", "templates", "learn", f"{chapter}.md"))
                figures = re.findall(r"!\[[^\]]+\]\(@REPO@/(results-course/[\w.-]+\.svg)\)", template)
                self.assertTrue(figures, "no figure of results-course/")
                for figure in figures:
                    self.assertTrue(os.path.isfile(os.path.join(HERE, figure)), figure)
                self.assertIn("```text", template, "no pseudocode block")
                self.assertRegex(template, r"\{\{[^}]*course\[", "no number rendered from its chapter report")
                for name in by_chapter[chapter]:
                    self.assertIn(f"python exercises.py check --atom {name}", template)


if __name__ == "__main__":
    unittest.main()
