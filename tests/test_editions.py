"""The Chinese edition: built from the English source, the same code, the glossary's terms.

A Chinese reader relies on getting the same course: every notebook has its twin with the same
cells and the same code, only its comments and printed captions in Chinese (so a fix lands in both), the same
template, the terms of
docs/glossary.md and none of the known mistranslations, and the kit's own messages in Chinese.
An author relies on the build refusing an edition whose translation is missing or stale.
"""

from __future__ import annotations

import ast
import re
import string
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from distlab import edition, i18n, svg

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
ZH = NOTEBOOKS / "zh"
STEMS = sorted(p.stem for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
TEMPLATE_ZH = ["学习目标", "核心思想", "先预测，再运行", "常见陷阱", "自测", "小结", "下一步"]
CJK = re.compile(r"[\u4e00-\u9fff]")
CHINESE_TEXT = re.compile(r"[\u3000-\u303f\u4e00-\u9fff\uff00-\uffef]")  # characters and punctuation
ENGLISH_WORDS = re.compile(r"\b[A-Za-z]{3,} [A-Za-z]{3,}\b")


def _read(path: Path) -> nbformat.NotebookNode:
    return nbformat.read(path, as_version=4)


def _markdown(nb: nbformat.NotebookNode) -> str:
    return "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")


def _glossary() -> list[tuple[str, str, list[str]]]:
    rows = []
    for line in (ROOT / "docs" / "glossary.md").read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0] and cells[0] not in ("English", "---") and not CJK.match(cells[0]):
            avoid = [w.strip() for w in cells[2].split(",") if w.strip()]
            rows.append((cells[0], cells[1], avoid))
    return rows


def test_every_english_notebook_has_a_chinese_twin() -> None:
    assert sorted(p.stem for p in ZH.glob("[0-9][0-9]_*.ipynb")) == STEMS


@pytest.mark.parametrize("stem", STEMS)
def test_the_twin_has_the_same_cells_and_the_same_code_with_its_comments_and_captions_translated(stem: str) -> None:
    """The same code; only comments and the text literals a cell prints or draws differ. A caption
    left in English must be one the catalogue keeps on purpose (text that code matches)."""
    en, zh = _read(NOTEBOOKS / f"{stem}.ipynb"), _read(ZH / f"{stem}.ipynb")
    catalogue = edition.Catalogue.load(NOTEBOOKS / "_build" / "zh" / f"{stem}.md")
    assert [c.cell_type for c in zh.cells] == [c.cell_type for c in en.cells]
    assert [c.get("id") for c in zh.cells] == [c.get("id") for c in en.cells]
    for a, b in zip(en.cells, zh.cells, strict=True):
        if a.cell_type == "code":
            (shape_en, literals_en), (shape_zh, literals_zh) = edition.code_shape(a.source), edition.code_shape(b.source)
            assert shape_zh == shape_en, f"{stem} {a.id}: code differs"
            for english, chinese in zip(literals_en, literals_zh, strict=True):
                if chinese != english:
                    # Chinese, or a shorter abbreviation where a table needs narrow text ("DP" for "data parallel")
                    assert catalogue.get(english) == chinese, (stem, english)
                    assert CHINESE_TEXT.search(chinese) or (chinese.isascii() and len(chinese) < len(english) / 2), \
                        (stem, english, chinese)
                    assert not edition.literal_problem(english, chinese), (stem, english)
                elif edition.reads_as_text(english):
                    assert catalogue.get(english) == english, f"{stem} {a.id}: caption not translated: {english}"
            assert b.metadata == a.metadata
            english = set(edition.comment_texts(a.source))
            for comment in edition.comment_texts(b.source):  # kept in English only when it is a formula
                assert CHINESE_TEXT.search(comment) or (comment in english and not ENGLISH_WORDS.search(comment)), \
                    f"{stem} {a.id}: comment not translated: {comment}"
        else:
            assert CJK.search(b.source), f"{stem} {a.id}: markdown not translated"
    assert zh.metadata["distlab"] == {"lang": "zh"}
    assert edition.language_of(zh) == "zh" and edition.language_of(en) == "en"


@pytest.mark.parametrize("stem", STEMS)
def test_the_twin_follows_the_template(stem: str) -> None:
    zh = _read(ZH / f"{stem}.ipynb")
    headings = [m.group(1).strip() for c in zh.cells if c.cell_type == "markdown"
                for m in re.finditer(r"^#{1,6}\s+(.+)$", c.source, flags=re.MULTILINE)]
    assert headings[0].startswith(f"{stem[:2]} ·")
    positions = [headings.index(h) for h in TEMPLATE_ZH]
    assert positions == sorted(positions), f"{stem}: template headings out of order"
    text = _markdown(zh)
    assert "<details><summary>答案</summary>" in text and "<summary>Answer</summary>" not in text


@pytest.mark.parametrize("stem", STEMS)
def test_links_reach_the_same_files(stem: str) -> None:
    zh = _read(ZH / f"{stem}.ipynb")
    links = re.findall(r"\]\(([^)\s]+)\)", _markdown(zh))
    assert links
    for link in links:
        if not link.startswith(("http://", "https://", "#")):
            assert (ZH / link).is_file(), f"{stem}: {link} does not exist"


def test_the_glossary_is_parsed_and_reads_both_ways() -> None:
    terms = {en: zh for en, zh, _ in _glossary()}
    text = (ROOT / "docs" / "glossary.md").read_text(encoding="utf-8")
    backwards = text[text.index("## 中文 → English"):]
    assert {(zh, en) for en, zh in terms.items()} == set(re.findall(r"^\| (.+?) \| (.+?) \|$", backwards, re.M)[1:])
    assert terms["rank"] == "rank" and terms["reduce"] == "归约" and terms["shard"] == "分片"
    assert len(terms) >= 30


@pytest.mark.parametrize("stem", STEMS)
def test_the_glossary_terms_are_used_and_mistranslations_are_not(stem: str) -> None:
    english = _markdown(_read(NOTEBOOKS / f"{stem}.ipynb"))
    chinese = _markdown(_read(ZH / f"{stem}.ipynb"))
    prose = re.sub(r"`[^`]*`", "", english)  # code names are not prose terms
    for en, zh, avoid in _glossary():
        if re.search(rf"\b{re.escape(en)}s?\b", prose, flags=re.IGNORECASE):
            assert zh in chinese, f"{stem}: '{en}' is in the English text, '{zh}' not in the Chinese"
        for wrong in avoid:
            assert wrong not in chinese, f"{stem}: '{wrong}' (the glossary says '{zh}')"
    for wrong in ("等级", "排名", "世界大小", "减少", "规约"):
        assert wrong not in chinese, f"{stem}: known mistranslation '{wrong}'"
    for operator in ("全归约", "全收集", "归约散射"):  # operator names stay in English
        assert operator not in chinese


def test_a_changed_english_cell_is_reported_not_shipped(tmp_path: Path) -> None:
    catalogue = tmp_path / "x.md"
    catalogue.write_text(f"<!-- en:{edition.key('## Summary')} -->\n## 小结\n\n"
                         f"<!-- en:{edition.key('old text')} -->\n旧的译文\n", encoding="utf-8")
    cells = [nbformat.v4.new_markdown_cell("## Summary"), nbformat.v4.new_markdown_cell("new text"),
             nbformat.v4.new_code_cell("x = 1  # a changed comment")]
    out, problems = edition.translate_cells(cells, edition.Catalogue.load(catalogue))
    assert out[0].source == "## 小结" and out[2].source == cells[2].source
    assert problems.missing == ["new text", "a changed comment"] and problems.unused == [edition.key("old text")]
    assert "no translation" in problems.describe(catalogue) and "no longer" in problems.describe(catalogue)
    assert edition.stubs(problems.missing).startswith(f"<!-- en:{edition.key('new text')} -->\nnew text")


def test_comments_are_translated_and_nothing_else_changes(tmp_path: Path) -> None:
    """A block of whole-line comments is one entry, a trailing comment another; nbgrader's
    markers, pragmas, strings holding '#' and IPython lines stay as they are."""
    source = ("%%dist -n 2\n"
              "# Every rank sends\n# to its right.\n"
              "for i in range(2):\n    # BEGIN SOLUTION\n    x = '# not a comment'  # the payload\n"
              "    # END SOLUTION\n    y = 1  # noqa: F841\n")
    catalogue = tmp_path / "x.md"
    catalogue.write_text(f"<!-- en:{edition.key('Every rank sends' + chr(10) + 'to its right.')} -->\n"
                         f"每个 rank 都发送给\n它右边的 rank。\n\n<!-- en:{edition.key('the payload')} -->\n载荷\n",
                         encoding="utf-8")
    out, problems = edition.translate_cells([nbformat.v4.new_code_cell(source)], edition.Catalogue.load(catalogue))
    assert not problems
    assert out[0].source == ("%%dist -n 2\n"
                             "# 每个 rank 都发送给\n# 它右边的 rank。\n"
                             "for i in range(2):\n    # BEGIN SOLUTION\n    x = '# not a comment'  # 载荷\n"
                             "    # END SOLUTION\n    y = 1  # noqa: F841\n")
    assert edition.without_comments(out[0].source) == edition.without_comments(source)
    assert edition.without_comments(source) != edition.without_comments(source.replace("range(2)", "range(3)"))


def test_captions_are_translated_with_their_fields_and_a_new_one_is_reported(tmp_path: Path) -> None:
    """A printed caption is translated in place, the f-string keeps its fields (words quoted in a
    field may change), an identifier stays, a translation that drops a field is refused, and an
    English caption with no entry is reported like an untranslated comment."""
    source = ('print(f"step {i}: loss {loss:.3f}")\n'
              'show(x, title="before the all_reduce")\n'
              'print(f"{\'fits\' if ok else \'does not fit\'} in memory")\n'
              'd["world_size"] = 4\n'
              'print("a new caption here")\n')
    entries = {'f"step {i}: loss {loss:.3f}"': 'f"第 {i} 步：损失 {loss:.3f}"',
               '"before the all_reduce"': 'f"all_reduce 之前"',
               'f"{\'fits\' if ok else \'does not fit\'} in memory"': 'f"{\'放得下\' if ok else \'放不下\'}"',
               '"a stale caption"': '"过时的译文"'}
    catalogue = tmp_path / "x.md"
    catalogue.write_text("".join(f"<!-- en:{edition.key(en)} -->\n{zh}\n\n" for en, zh in entries.items()),
                         encoding="utf-8")
    out, problems = edition.translate_cells([nbformat.v4.new_code_cell(source)], edition.Catalogue.load(catalogue))
    assert out[0].source == ('print(f"第 {i} 步：损失 {loss:.3f}")\n'
                             'show(x, title="before the all_reduce")\n'  # refused: it became an f-string
                             'print(f"{\'放得下\' if ok else \'放不下\'}")\n'
                             'd["world_size"] = 4\n'
                             'print("a new caption here")\n')
    assert problems.missing == ['"a new caption here"']
    assert problems.unused == [edition.key('"a stale caption"')]
    assert len(problems.wrong) == 1 and "prefix" in problems.wrong[0]
    assert "differ" in edition.literal_problem('f"step {i}"', 'f"第 {j} 步"')
    assert edition.literal_problem('"a b"', '"甲" + "乙"') == "not a single string literal"
    assert edition.code_shape(out[0].source)[0] == edition.code_shape(source)[0]


def test_a_table_header_is_translated_and_keeps_its_columns(tmp_path: Path) -> None:
    """A header made of quoted words in fields may change its words and their widths, as long as
    each field fills the English columns (a Chinese character takes two): the rows below stay
    aligned. A translation that keeps the English width is refused, and says why."""
    english = 'f"{\'GPUs\':>5} {\'flat ring\':>10}"'
    aligned = 'f"{\'卡数\':>3} {\'平坦的环\':>6}"'
    too_wide = 'f"{\'卡数\':>5} {\'平坦的环\':>10}"'
    assert edition.literal_problem(english, aligned) == ""
    assert "alignment" in edition.literal_problem(english, too_wide)
    assert "differ" in edition.literal_problem(english, 'f"{\'卡数\':>3} {rank:>6}"')  # a word, not code
    source = f"print({english})\nfor n, t in rows:\n    print(f\"{{n:>5}} {{t:>10}}\")\n"
    catalogue = tmp_path / "x.md"
    catalogue.write_text(f"<!-- en:{edition.key(english)} -->\n{aligned}\n", encoding="utf-8")
    out, problems = edition.translate_cells([nbformat.v4.new_code_cell(source)], edition.Catalogue.load(catalogue))
    assert not problems.wrong and out[0].source.startswith(f"print({aligned})")
    header = eval(aligned)  # noqa: S307 - our own literal
    assert svg.columns(header) == len(eval(english)) == len(f"{8:>5} {78:>10}")  # noqa: S307


def test_the_build_check_fails_on_a_stale_translation(tmp_path: Path) -> None:
    """Copy the build, make one catalogue stale, and --check must fail and say where."""
    import shutil

    work = tmp_path / "notebooks"
    shutil.copytree(NOTEBOOKS, work, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "src", tmp_path / "src", ignore=shutil.ignore_patterns("__pycache__"))
    catalogue = work / "_build" / "zh" / "03_broadcast.md"
    text = catalogue.read_text(encoding="utf-8")
    first = re.search(r"<!-- en:([0-9a-f]{10}) -->", text)
    assert first
    catalogue.write_text(text.replace(first.group(1), "0" * 10, 1), encoding="utf-8")
    proc = subprocess.run([sys.executable, str(work / "_build" / "build.py"), "--check"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert "03_broadcast.md" in proc.stdout and "no translation" in proc.stdout


def _tr_calls() -> list[tuple[str, str]]:
    found = []
    for path in (ROOT / "src" / "distlab").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("tr", "figure_tr") and node.args:
                first = node.args[0]
                if isinstance(first, ast.Constant) and isinstance(first.value, str):
                    found.append((path.name, first.value))
                elif isinstance(first, ast.Name):  # a template chosen from literals above
                    continue
                else:
                    raise AssertionError(f"{path.name}: tr() of a non-literal")
    return found


def _fields(template: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(template) if name}


def test_every_message_the_kit_shows_has_a_chinese_translation() -> None:
    calls = _tr_calls()
    assert len(calls) >= 25
    for where, template in calls:
        assert template in i18n.ZH, f"{where}: no Chinese for {template!r}"
        assert _fields(i18n.ZH[template]) == _fields(template), f"{where}: fields differ: {template!r}"
        assert CJK.search(i18n.ZH[template])
    notes = re.findall(r'passed\(note="([^"]+)"\)', "".join(
        c.source for p in NOTEBOOKS.glob("*.ipynb") for c in _read(p).cells if c.cell_type == "code"))
    assert notes and all(n in i18n.ZH for n in notes)
    titles = re.findall(r'timeline_figure\([^)]*?title="([^"]+)"', "".join(  # the kit draws them in Chinese
        c.source for p in NOTEBOOKS.glob("*.ipynb") for c in _read(p).cells if c.cell_type == "code"))
    assert titles and all(t in i18n.ZH for t in titles), titles


def test_the_language_is_chosen_by_environment_or_by_the_edition_folder(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("DISTLAB_LANG", raising=False)
    monkeypatch.chdir(tmp_path)
    assert i18n.language() == "en"
    monkeypatch.chdir(ZH)
    assert i18n.language() == "zh"
    i18n.passed([1, 2])
    assert capsys.readouterr().out == "自测通过：[1, 2]\n"
    monkeypatch.setenv("DISTLAB_LANG", "en")
    assert i18n.language() == "en"
    i18n.passed()
    assert capsys.readouterr().out == "self-check passed\n"
    monkeypatch.setenv("DISTLAB_LANG", "zh_CN.UTF-8")
    assert i18n.tr("{failed} of {n} ranks failed", failed=1, n=4) == "4 个 rank 中有 1 个失败"
    assert i18n.tr("{failed} of {n} ranks failed", "en", failed=1, n=4) == "1 of 4 ranks failed"


ENGLISH_LINE = re.compile(r"(?:\b[A-Za-z]{3,}\b[^A-Za-z\u4e00-\u9fff]*){5}")  # five English words in a row


@pytest.mark.parametrize("assignment", sorted(p.name for p in (ROOT / "exercises" / "zh").iterdir() if p.is_dir()))
def test_a_chinese_exercise_has_no_english_prose_left_even_in_its_pictures(assignment: str) -> None:
    """The ASCII pictures of exercises 1, 2 and 4 (in fenced blocks, where the release copies text
    as it is) stayed English in the Chinese edition: "after n - 1 steps: rank 2 owns A ...".
    Inline code, formulas and links are left out; what is left may not read as an English line."""
    nb = _read(ROOT / "exercises" / "zh" / assignment / f"{assignment}.ipynb")
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        for line in cell.source.splitlines():
            prose = re.sub(r"`[^`]*`|\$[^$]*\$|\]\([^)]*\)", "", line)
            assert CJK.search(prose) or not ENGLISH_LINE.search(prose), f"{assignment}: {line}"
