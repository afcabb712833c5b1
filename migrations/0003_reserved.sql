-- Reserved: the number 0003 belongs to a change developed on another branch (typed
-- dead-letter origins). This placeholder keeps the sequence whole on the console branch and
-- is replaced by that migration when the branches merge. It changes nothing.
SELECT 1;

---- create above / drop below ----

SELECT 1;
