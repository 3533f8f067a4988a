-- Tables, a recursive CTE, an index, joins, aggregates and a transaction.
CREATE TABLE item(id INTEGER PRIMARY KEY, name TEXT, price REAL, cat INTEGER);
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 20000)
INSERT INTO item SELECT i, printf('item-%05d', i), (i * 37 % 1000) / 10.0, i % 17 FROM n;
CREATE TABLE cat(id INTEGER PRIMARY KEY, label TEXT);
WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < 16)
INSERT INTO cat SELECT i, 'cat-' || char(65 + i) FROM n;
CREATE INDEX item_price ON item(price);
BEGIN;
UPDATE item SET price = price * 2 WHERE cat = 3;
DELETE FROM item WHERE id % 1000 = 0;
COMMIT;
SELECT count(*), round(sum(price), 2), min(name), max(name) FROM item;
SELECT c.label, count(*), round(avg(i.price), 3) FROM item i JOIN cat c ON c.id = i.cat
    GROUP BY c.label ORDER BY c.label;
SELECT name, price FROM item WHERE price BETWEEN 50 AND 50.5 ORDER BY price, name LIMIT 10;
SELECT group_concat(name, ',') FROM (SELECT name FROM item ORDER BY price DESC, id LIMIT 5);
PRAGMA integrity_check;
