"""What an earlier check already judged, kept so that it is not judged twice: a whole plan's check (checkmemo,
and the cache directory every memo lives in), one job's lint findings (lintmemo), and the shapes that let one
shellcheck run stand for every job of the same shape (shapes).

Doors: `plancompiler.memo.checkmemo` (the CLI's check and `lint`'s cache), `plancompiler.memo.lintmemo` and
`plancompiler.memo.shapes` (for `lint`). Nothing is imported here."""
