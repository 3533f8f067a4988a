/* A library of 2,000 functions, loaded with dlopen: the counter segment
 * grows by more than a page of counters per stripe. */
#include "many_functions.h"
MANY_FUNCTIONS(2000);
