-- An attempt row is written twice: by its claim (INSERT) and by its mark (UPDATE of
-- columns no index holds). With room left on each page the mark is a heap-only update:
-- the new row version goes on the same page and no index of attempts gains an entry.
-- Pages filled whole (the default) leave no room, so every mark wrote one entry into each
-- of the table's three indexes. Existing pages keep their fill; new ones are filled to 70 %.
ALTER TABLE attempts SET (fillfactor = 70);
