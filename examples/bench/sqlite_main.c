/* An SQLite workout on an in-memory database: inserts in a transaction,
 * an index, aggregates, joins and LIKE scans. */
#include <stdio.h>
#include <stdlib.h>
#include "sqlite3.h"

static void run(sqlite3 *db, const char *sql) {
    char *err = 0;
    if (sqlite3_exec(db, sql, 0, 0, &err) != SQLITE_OK) {
        fprintf(stderr, "%s: %s\n", sql, err);
        exit(1);
    }
}

static long long scalar(sqlite3 *db, const char *sql) {
    sqlite3_stmt *st;
    long long v = 0;
    if (sqlite3_prepare_v2(db, sql, -1, &st, 0) != SQLITE_OK) exit(1);
    if (sqlite3_step(st) == SQLITE_ROW) v = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return v;
}

int main(int argc, char **argv) {
    int rows = argc > 1 ? atoi(argv[1]) : 100000;
    sqlite3 *db;
    if (sqlite3_open(":memory:", &db) != SQLITE_OK) return 1;
    run(db, "CREATE TABLE t(id INTEGER PRIMARY KEY, k INTEGER, name TEXT)");
    run(db, "CREATE TABLE u(k INTEGER, label TEXT)");
    run(db, "BEGIN");
    sqlite3_stmt *ins;
    sqlite3_prepare_v2(db, "INSERT INTO t(k, name) VALUES(?, ?)", -1, &ins, 0);
    char name[32];
    unsigned x = 12345;
    for (int i = 0; i < rows; i++) {
        x = x * 1103515245u + 12345u;
        snprintf(name, sizeof name, "name-%u", x % 100000);
        sqlite3_bind_int(ins, 1, (int)(x % 1000));
        sqlite3_bind_text(ins, 2, name, -1, SQLITE_TRANSIENT);
        sqlite3_step(ins);
        sqlite3_reset(ins);
    }
    sqlite3_finalize(ins);
    for (int k = 0; k < 1000; k++) {
        char sql[80];
        snprintf(sql, sizeof sql, "INSERT INTO u VALUES(%d, 'label-%d')", k, k * 7);
        run(db, sql);
    }
    run(db, "COMMIT");
    run(db, "CREATE INDEX tk ON t(k)");
    long long s = 0;
    s += scalar(db, "SELECT sum(k) FROM t WHERE name LIKE '%77%'");
    s += scalar(db, "SELECT count(*) FROM t JOIN u ON t.k = u.k WHERE u.label LIKE '%1%'");
    s += scalar(db, "SELECT max(c) FROM (SELECT k, count(*) AS c FROM t GROUP BY k)");
    s += scalar(db, "SELECT count(DISTINCT name) FROM t");
    for (int k = 0; k < 2000; k++) {
        char sql[64];
        snprintf(sql, sizeof sql, "SELECT count(*) FROM t WHERE k = %d", k % 1000);
        s += scalar(db, sql);
    }
    printf("%lld\n", s);
    sqlite3_close(db);
    return 0;
}
