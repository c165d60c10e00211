// A temporary directory tree for the sysfs-style RDMA tests, removed on
// destruction.
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace mctest {

class TmpDir {
public:
    TmpDir() {
        char tmpl[] = "/tmp/mc_rdma_test_XXXXXX";
        const char *p = ::mkdtemp(tmpl);
        path_ = p ? p : "";
    }
    ~TmpDir() {
        if (!path_.empty()) std::system(("rm -rf '" + path_ + "'").c_str());
    }
    TmpDir(const TmpDir &) = delete;
    TmpDir &operator=(const TmpDir &) = delete;

    const std::string &path() const { return path_; }
    std::string at(const std::string &rel) const { return path_ + "/" + rel; }

    // mkdir -p of <root>/<rel>
    void mkdirs(const std::string &rel) const {
        std::string cur = path_;
        size_t pos = 0;
        while (pos <= rel.size()) {
            size_t slash = rel.find('/', pos);
            if (slash == std::string::npos) slash = rel.size();
            cur += "/" + rel.substr(pos, slash - pos);
            ::mkdir(cur.c_str(), 0755);
            pos = slash + 1;
        }
    }
    // Writes <root>/<rel>, creating parents.
    void write(const std::string &rel, const std::string &content) const {
        size_t slash = rel.rfind('/');
        if (slash != std::string::npos) mkdirs(rel.substr(0, slash));
        FILE *f = std::fopen(at(rel).c_str(), "w");
        if (!f) return;
        std::fwrite(content.data(), 1, content.size(), f);
        std::fclose(f);
    }
    // <root>/<rel> -> target (absolute, or relative to the link's directory).
    bool symlink(const std::string &target, const std::string &rel) const {
        size_t slash = rel.rfind('/');
        if (slash != std::string::npos) mkdirs(rel.substr(0, slash));
        return ::symlink(target.c_str(), at(rel).c_str()) == 0;
    }

private:
    std::string path_;
};

}  // namespace mctest
