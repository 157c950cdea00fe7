/* diag's injection library: queue the payload as a Python "pending call", and nothing more.

   pyinjector dlopen()s this file inside the target from whatever instruction its main thread was
   stopped at (possibly inside take_gil/drop_gil, holding the GIL's own mutex). Taking the GIL from
   there (PyGILState_Ensure) can deadlock the rank, so the constructor only calls Py_AddPendingCall,
   which CPython documents as callable from any thread without the GIL: the interpreter then runs
   PyRun_SimpleString(copy) on the main thread, with the GIL, at its next bytecode boundary.
   The copy lives on the heap because this library is unloaded right after the constructor returns.
   diag writes the Python payload over DIAG_PAYLOAD in a private copy of this file's compiled form. */
#include <stdlib.h>
#include <string.h>

extern int Py_AddPendingCall(int (*func)(void *), void *arg);
extern int PyRun_SimpleString(const char *command);

char DIAG_PAYLOAD[4096] = "--- diag pending-call payload ---";

__attribute__((constructor)) static void diag_queue_payload(void) {
    char *code = strdup(DIAG_PAYLOAD);
    if (code != NULL && Py_AddPendingCall((int (*)(void *))PyRun_SimpleString, code) != 0) {
        free(code); /* the queue (32 slots) is full: nothing runs; diag attach times out, says so */
    }
}
